"""The reference backend's page keys, built from where the tokens come from (pages in a
sequence's leading run of hash-block tokens from the block hashes, pages inside a run of
request-unique tokens from the request and the position, any other page from its token ids,
synthesized lazily), have exactly the equalities of keys hashed from the whole token sequences:
across every request of the bundled workloads at page sizes that are multiples, divisors or
neither of the hash block, prompt and output pages both, a page's fast key and its token key
correspond one to one."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay.backends.reference.keys import KeyDonors, LazyPrompt, PageKeys, SequenceOrigins
from replay.backends.reference.scheduler import ReferenceBackend
from replay.backends.reference.settings import from_knobs
from replay.knobs import resolve
from replay.workloads import read_workload

WORKLOADS = Path(__file__).resolve().parents[2] / "data" / "workloads"


def _lazy(be, wl, ps: int) -> dict:
    """Every request's ``PageKeys`` keyed from its origins as needed (no table), with the
    donors a run's keying uses, made in arrival order: rid -> (keys, its output ids list)."""
    donors, out = KeyDonors(wl.requests, be._synth._next_turn), {}
    for w in wl.requests:
        outputs = []
        keys = PageKeys(LazyPrompt(be._synth, w, int(w.input_len)), ps, outputs, SequenceOrigins(be._synth, w))
        donors.adopt(keys, w)
        out[int(w.rid)] = (keys, outputs)
    return out


def _pairs(wl, ps: int) -> tuple[list, int, int]:
    """(fast key, token key) of every page of every request's whole planned sequence, and how
    many pages were keyed from block hashes and as request-unique. The run's keys (each
    request's whole planned sequence keyed at its arrival, ``keytable.planned_keys``) are also
    those of the same request keyed lazily, in pieces, as a chunked prefill and the decode ask."""
    values, _ = resolve("swa-fixes", [f"page_size={ps}", "full_pool_tokens=" + str(ps << 20)],
                        wl.manifest.get("server"))
    pairs, block_pages, unique_pages = [], 0, 0
    with ReferenceBackend(wl, from_knobs(values)) as be:
        be.clock_ns = max(w.arrival_ns for w in wl.requests)
        be._admit_arrivals()
        lazy = _lazy(be, wl, ps)
        for req in be._active.values():
            real = be._synth.output_ids(req.wreq)  # the planned output ids (``req.plan`` stands in for them)
            assert len(real) == len(req.plan) and [t == 0 for t in real] == [t == 0 for t in req.plan]
            whole = PageKeys(be._synth._sequence(req.wreq, req.input_len), ps, real)
            keys, outputs = lazy[req.rid]
            third = req.input_len // 3  # a prefix's reader: the own list, at least that long, no copy
            c = keys.covering(third)
            assert c is keys.keys and len(c) >= third // ps and c[: third // ps] == keys.up_to(third)
            a = keys.up_to(req.input_len // 2)  # lazily, in two pieces, as a chunked prefill
            assert a == keys.up_to(req.input_len)[:len(a)]
            outputs.extend(req.plan)  # the output pages, as the decode appends them
            req.output_ids.extend(req.plan)
            n = req.input_len + len(req.plan)
            fast, slow = keys.up_to(n), whole.up_to(n)
            assert len(fast) == len(slow) == n // ps, req.rid
            assert req.keys.up_to(n) == fast, req.rid  # the run's keys
            pairs += zip(fast, slow)
            block_pages += keys._block_pages
            unique_pages += sum(max(0, b // ps - -(-a // ps)) for a, b, _ in keys._origins.runs)
    return pairs, block_pages, unique_pages


def _one_to_one(pairs) -> None:
    fwd, back = {}, {}
    for fast, slow in pairs:
        assert fwd.setdefault(fast, slow) == slow, "one fast key for two token prefixes"
        assert back.setdefault(slow, fast) == fast, "two fast keys for one token prefix"


@pytest.mark.parametrize("ps", (1, 8, 16, 48, 64, 24))
@pytest.mark.parametrize("name", ("multi_turn", "agentic", "mixed", "shared_prefix"))
def test_fast_keys_have_the_equalities_of_token_keys(name, ps):
    wl = read_workload(WORKLOADS / name)
    wl.__dict__["requests"] = wl.requests[:150]
    adopted = PageKeys.adopted_pages
    pairs, block_pages, unique_pages = _pairs(wl, ps)
    _one_to_one(pairs)
    if name in ("multi_turn", "shared_prefix") and ps in (8, 16, 64):
        # a turn takes its previous turn's block pages; a session's first turn those of the last
        # request that began with its system prompt
        assert PageKeys.adopted_pages > adopted
    assert len(pairs) > len({f for f, _ in pairs}), "no page shared between requests: the check says nothing"
    if ps % wl.hash_block_tokens == 0 or wl.hash_block_tokens % ps == 0:
        assert block_pages > 0, "no page keyed from block hashes"
    assert unique_pages > 0, "no page keyed as request-unique"


def _session_workload(path: Path, seed: int, bt: int, n: int) -> None:
    """Sessions whose turns extend the previous turn's prompt and output (so outputs are copied
    from the next turn), prompts that end on a block boundary or inside a block, hashes that
    cover the prompt's partial last block or stop before it (the next turn's block there having
    the same hash or another), stops before ``max_new_tokens`` (EOS) and shared first blocks
    across sessions."""
    from replay.backends.sglang.workload import write_workload

    rng = random.Random(seed)
    system = [rng.getrandbits(62) for _ in range(4)]
    rows, sessions = [], {}
    for i in range(n):
        if sessions and rng.random() < 0.6:
            sid = rng.choice(list(sessions))
            prev_len, prev_hashes, prev_out = sessions[sid]
            tokens = prev_len + prev_out + rng.randint(0, 3 * bt)
            if rng.random() < 0.5:  # the previous partial block's hash is not this turn's block
                prev_hashes = prev_hashes[:prev_len // bt]
        else:
            sid, prev_hashes = len(sessions), system[:rng.randint(0, 4)]
            tokens = max(1, len(prev_hashes) * bt + rng.randint(-bt, 4 * bt))
        full = tokens // bt
        hashes = list(prev_hashes[:full]) + [rng.getrandbits(62) for _ in range(full - min(full, len(prev_hashes)))]
        if tokens % bt and rng.random() < 0.5:
            hashes.append(rng.getrandbits(62))  # the partial last block hashed too (imported traces)
        out = rng.randint(1, 4 * bt)
        rows.append(dict(rid=i, ts_ns=i, input_len=tokens, page_hashes=hashes, session_id=sid,
                         turn=i, output_len=out, max_new_tokens=out + rng.choice((0, 0, 1, 5))))
        sessions[sid] = (tokens, hashes, out)
    write_workload(path, rows, hash_block_tokens=bt)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), bt=st.sampled_from((4, 16)), ps=st.sampled_from((1, 2, 4, 6, 8, 16, 32)))
def test_fast_keys_one_to_one_on_adversarial_sessions(tmp_path_factory, seed, bt, ps):
    path = tmp_path_factory.mktemp("wl") / "w"
    _session_workload(path, seed, bt, 60)
    pairs, _, _ = _pairs(read_workload(path), ps)
    _one_to_one(pairs)


def test_copied_outputs_share_the_next_turns_pages():
    """A turn whose prompt ends on a block boundary generates the next turn's tokens: its output
    pages (keyed from the next turn's block hashes) are the next turn's prompt pages."""
    wl = read_workload(WORKLOADS / "multi_turn")
    values, _ = resolve("swa-fixes", ["page_size=16", "full_pool_tokens=" + str(1 << 24)], wl.manifest.get("server"))
    found = 0
    with ReferenceBackend(wl, from_knobs(values)) as be:
        be.clock_ns = max(w.arrival_ns for w in wl.requests)
        be._admit_arrivals()
        reqs = {r.rid: r for r in be._active.values()}
        lazy = _lazy(be, wl, 16)
        for req in reqs.values():
            nxt, shared = be._synth._copied_from(req.wreq)
            if nxt is None or nxt.rid not in reqs or req.input_len % 16 or shared < 32:
                continue
            req.output_ids.extend(req.plan)
            lazy[req.rid][1].extend(req.plan)
            pages = (req.input_len + shared - 1) // 16
            assert lazy[req.rid][0]._block_pages > req.input_len // 16
            mine = req.keys.up_to(pages * 16)
            theirs = reqs[nxt.rid].keys.up_to(pages * 16)
            assert mine == theirs == lazy[req.rid][0].up_to(pages * 16)
            found += 1
    if not found:
        pytest.skip("multi_turn has no turn ending on a block boundary whose next turn is loaded")


def test_sequence_slice_is_the_slice_of_the_sequence():
    from replay.backends.sglang.tokens import TokenSynth

    wl = read_workload(WORKLOADS / "mixed")
    syn = TokenSynth(wl)
    rng = np.random.default_rng(0)
    for w in wl.requests[:100]:
        n = w.input_len + 40
        full = syn._sequence(w, n)
        for a, b in rng.integers(0, n + 1, size=(6, 2)):
            a, b = min(a, b), max(a, b)
            assert np.array_equal(syn.sequence_slice(w, int(a), int(b)), full[a:b])


@pytest.mark.parametrize("name", ("multi_turn", "agentic"))
def test_planned_slice_is_the_slice_of_the_whole_planned_sequence(name):
    """``planned_slice`` computes only the positions asked for (a boundary page's ids, not the
    whole output): the same ids as the prompt then ``output_ids``, copied turns and EOS included."""
    from replay.backends.sglang.tokens import TokenSynth

    wl = read_workload(WORKLOADS / name)
    syn = TokenSynth(wl)
    rng = np.random.default_rng(1)
    copied = 0
    for w in wl.requests[:300]:
        whole = np.concatenate((syn._sequence(w, w.input_len), np.array(syn.output_ids(w), dtype=np.int64)))
        copied += syn._copied_from(w)[1] > 0
        n = len(whole)
        cuts = [(0, n), (w.input_len, n), (n - 1, n + 5), (w.input_len - 3, w.input_len + 3)]
        cuts += [tuple(sorted(map(int, rng.integers(0, n + 1, size=2)))) for _ in range(6)]
        for a, b in cuts:
            a = max(0, a)
            assert np.array_equal(syn.planned_slice(w, a, b), whole[a:b]), (w.rid, a, b)
    assert copied, f"{name}: no turn copies the next turn's prompt"
