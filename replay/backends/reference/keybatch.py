"""Every request's page keys at once (a key table, :mod:`replay.backends.reference.keytable`),
the digests and chains of many requests computed together.

:class:`replay.backends.reference.keys.PageKeys` keys one request at a time: its leading block
pages taken from a donor (an earlier request with the same hashes), its other pages' digests,
then their chain ``c_k = c_{k-1} * P + d_k`` (mod 2^64), mixed into keys. Per request that is a
dozen numpy calls on a few hundred pages, so a table of an hour of traffic costs mostly numpy's
per-call overhead. Here each request is planned as ``PageKeys`` would key it (the same donors and
adopted pages, the same runs of digest kinds, from ``PageKeys``' own methods), and a batch of
requests is keyed in a few whole-array operations per kind: the block-hash pages, the
request-unique pages and the copied-block pages of all of them together (the digest functions
``block_page_digests`` and ``unique_page_digests`` call: ``whole_block_digests``,
``part_block_digests``, ``unique_digests``); only the pages where kinds of token meet are
digested request by request (from their token ids). The chain is linear in its
start value, so each request's chain is computed from 0 (a segmented cumulative sum) and its
donor's chain value added after (``c_k(prev) = c_k(0) + P^(k+1) prev``), the start values
resolved in arrival order (a donor arrives first). The keys are the same ints ``PageKeys`` gives,
the adopted ones the donor's own objects (``tests/reference/test_keybatch.py``).
"""

from __future__ import annotations

import numpy as np

from replay.backends.reference.keys import (TOKEN_PAGES, UNIQUE_PAGES, KeyDonors, LazyPrompt, PageKeys,
                                            SequenceOrigins, chain_powers, chain_values_to_keys, part_block_digests,
                                            token_page_digests, unique_digests, unique_seeds, whole_block_digests)
from replay.backends.reference.request import output_plan

#: pages keyed in one batch at most (the whole-array temporaries: ~100 B a page)
BATCH_PAGES = 2_000_000
_MASK = (1 << 64) - 1


class _Plan:
    """One request's keys as planned: ``adopted`` leading keys from ``donor`` (a plan), then
    ``count`` keys chained from its digests (at ``off`` in its batch's chain array)."""

    __slots__ = ("rid", "index", "pages", "donor", "adopted", "count", "chains", "off", "prev", "done", "keys")

    def __init__(self, rid: int, pages: int, index: int = 0) -> None:
        self.rid, self.pages, self.index = rid, pages, index
        self.donor, self.adopted, self.count = None, 0, 0
        self.chains, self.off, self.prev, self.done = None, 0, 0, False
        self.keys: list[int] | None = None

    def chain_at(self, page: int) -> int:
        """The chain value after page ``page`` (< ``pages``; its donors planned)."""
        plan = self
        while page < plan.adopted:
            plan = plan.donor
        k = page - plan.adopted
        c = int(plan.chains[plan.off + k])
        if plan.done:  # its batch's chains carry their start values
            return c
        return (c + int(chain_powers(k + 2)[0][k + 1]) * plan.prev) & _MASK


class _Batch:
    """The digest runs of a batch of requests, by kind, each with its place in the batch's
    digest array."""

    def __init__(self, ps: int, block_tokens: int) -> None:
        self.ps, self.bt = ps, block_tokens
        self.plans: list[_Plan] = []
        self.pages = 0
        # block-hash runs (the leading run and copied ones): (hashes, first, end, at)
        self.blocks: list[tuple] = []
        self.unique: list[tuple] = []  # (rid, first, end, at)
        self.tokens: list[tuple] = []  # (digests, at)

    def add(self, plan: _Plan, pk: PageKeys) -> None:
        """Plan ``plan``'s digests (``pk`` keyed as ``PageKeys.up_to`` of its whole sequence)."""
        n = plan.pages
        at = self.pages
        have = plan.adopted
        org = pk._origins
        nb = pk._block_pages
        if have < nb and have < n:
            end = min(n, nb)
            self.blocks.append((org.hashes, have, end, at))
            at += end - have
            have = end
        if have < n:
            ps = self.ps
            for kind, j0, j1, rid in pk._origin_runs(have, n):
                where = at + j0 - have
                if kind is TOKEN_PAGES:
                    self.tokens.append((token_page_digests(org.tokens(j0 * ps, j1 * ps), ps), where))
                elif kind is UNIQUE_PAGES:
                    self.unique.append((rid, j0, j1, where))
                else:
                    self.blocks.append((org.copied[2], j0, j1, where))
            at += n - have
        plan.count = at - self.pages
        plan.off = self.pages
        self.pages = at
        self.plans.append(plan)

    def digests(self) -> np.ndarray:
        """Every page's digest, in the batch's order."""
        d = np.empty(self.pages, dtype=np.uint64)
        if self.blocks:
            _scatter(d, self.blocks, self._block_digests())
        if self.unique:
            _scatter(d, self.unique, self._unique_digests())
        for values, at in self.tokens:
            d[at:at + len(values)] = values
        return d

    def _block_digests(self) -> np.ndarray:
        """``block_page_digests`` of every block run, concatenated."""
        ps, bt = self.ps, self.bt
        runs = self.blocks
        if ps % bt == 0:
            k = ps // bt
            h = np.concatenate([np.asarray(hs[j0 * k:j1 * k], dtype=np.uint64) for hs, j0, j1, _ in runs])
            return whole_block_digests(h.reshape(-1, k))
        per = bt // ps
        # each run's blocks, concatenated; a page's block at its run's base plus its block's index
        firsts = [j0 // per for _, j0, _, _ in runs]
        ends = [-(-j1 // per) for _, _, j1, _ in runs]
        h = np.concatenate([np.asarray(hs[a:b], dtype=np.uint64) for (hs, _, _, _), a, b in zip(runs, firsts, ends)])
        j = _ranges([(j0, j1) for _, j0, j1, _ in runs])
        bases = np.cumsum([0] + [b - a for a, b in zip(firsts[:-1], ends[:-1])]) - np.array(firsts)
        return part_block_digests(h[np.repeat(bases, [j1 - j0 for _, j0, j1, _ in runs]) + j // per], j % per)

    def _unique_digests(self) -> np.ndarray:
        """``unique_page_digests`` of every unique run, concatenated."""
        runs = self.unique
        seeds = np.repeat(unique_seeds([rid for rid, _, _, _ in runs]), [j1 - j0 for _, j0, j1, _ in runs])
        return unique_digests(seeds, (_ranges([(j0, j1) for _, j0, j1, _ in runs]) * self.ps + 1).astype(np.uint64))


def _ranges(spans: list[tuple[int, int]]) -> np.ndarray:
    """``[a, a+1, ..., b-1]`` of every span ``(a, b)``, concatenated (int64)."""
    lens = np.array([b - a for a, b in spans], dtype=np.int64)
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    total = int(lens.sum())
    firsts = np.zeros(len(spans), dtype=np.int64)
    np.cumsum(lens[:-1], out=firsts[1:])
    return np.arange(total, dtype=np.int64) + np.repeat(starts - firsts, lens)


def _scatter(d: np.ndarray, runs: list[tuple], values: np.ndarray) -> None:
    """``values`` (the runs' digests, concatenated) into ``d`` at each run's place (its last
    field; a run's length: its second and third fields' difference)."""
    d[_ranges([(r[-1], r[-1] + r[2] - r[1]) for r in runs])] = values


def build_rows(workload, page_size: int, requests) -> dict[int, list[int]]:
    """rid -> the keys of the request's whole planned sequence, for ``requests`` in arrival
    order (see the module docstring)."""
    rows: dict[int, list[int]] = {}
    for plans, keys in key_batches(workload, page_size, requests):
        list_batch(plans, keys.tolist(), rows)
    return rows


def key_batches(workload, page_size: int, requests, first_batch_pages: int | None = None):
    """The keys of ``requests`` (in arrival order), batch by batch: per batch its plans (each
    with its ``index`` in ``requests``, its ``donor`` plan and ``adopted`` leading keys, and its
    ``count`` own keys at ``off``) and its own keys (uint64, the plans' runs in order). With
    ``first_batch_pages``, the first batch holds about that many pages and each next one twice
    the last's, up to :data:`BATCH_PAGES` (a batch's size changes no key)."""
    from replay.backends.sglang.tokens import TokenSynth

    synth = TokenSynth(workload)
    donors = KeyDonors(requests, synth._next_turn)
    # id(PageKeys) -> its plan: a donor is alive (``donors`` holds it), and a PageKeys made
    # after one was freed writes its own entry before anything looks it up
    plans: dict[int, _Plan] = {}
    limit = BATCH_PAGES if first_batch_pages is None else max(1, min(first_batch_pages, BATCH_PAGES))
    batch = _Batch(page_size, synth.block_tokens)
    for i, w in enumerate(requests):
        plan_out = output_plan(w)
        n_in = int(w.input_len)
        pk = PageKeys(LazyPrompt(synth, w, n_in), page_size, plan_out, SequenceOrigins(synth, w))
        donors.adopt(pk, w)
        plan = _Plan(int(w.rid), (n_in + len(plan_out)) // page_size, i)
        plans[id(pk)] = plan
        _adopt(plan, pk, plans)
        batch.add(plan, pk)
        if batch.pages >= limit:
            yield batch.plans, _key_batch(batch)
            batch = _Batch(page_size, synth.block_tokens)
            limit = min(2 * limit, BATCH_PAGES)
    if batch.plans:
        yield batch.plans, _key_batch(batch)


def _adopt(plan: _Plan, pk: PageKeys, plans: dict) -> None:
    """The donor and the leading pages ``plan`` adopts, as ``PageKeys.up_to`` of its whole
    sequence takes them (``PageKeys._adopt``)."""
    donors, pk._donor = pk._donor, None
    if not donors or plan.pages <= 0:
        return
    shared, i = max((pk._shared_pages(d, plans[id(d)].pages), i) for i, d in enumerate(donors))
    if shared > 0:
        plan.donor, plan.adopted = plans[id(donors[i])], min(shared, plan.pages)
        PageKeys.adopted_pages += shared


def _key_batch(batch: _Batch) -> np.ndarray:
    """Chain and mix the keys of ``batch`` (its donors planned by now): its plans' own keys, in
    order (each plan's ``count`` at its ``off``)."""
    plans = batch.plans
    total = batch.pages
    lens = np.fromiter((p.count for p in plans), dtype=np.int64, count=len(plans))
    starts = np.fromiter((p.off for p in plans), dtype=np.int64, count=len(plans))
    chains = np.zeros(0, dtype=np.uint64)
    pw = None
    if total:
        local = np.arange(total, dtype=np.int64) - np.repeat(starts, lens)  # each page's index in its request
        pw, pwi = chain_powers(int(lens.max()) + 1)
        summed = np.zeros(total + 1, dtype=np.uint64)
        np.cumsum(batch.digests() * pwi[local], dtype=np.uint64, out=summed[1:])
        chains = pw[local] * (summed[1:] - np.repeat(summed[starts], lens))  # each chain from 0
    # each request's start value: its donor's chain after its last adopted page, in arrival order
    # (a donor's is known by then); then c_k(prev) = c_k(0) + P^(k+1) prev, all at once
    prevs = np.zeros(len(plans), dtype=np.uint64)
    for i, p in enumerate(plans):
        p.chains = chains
        if p.donor is not None:
            p.prev = p.donor.chain_at(p.adopted - 1)
            prevs[i] = p.prev
    if total:
        chains += pw[local + 1] * np.repeat(prevs, lens)
    for p in plans:
        p.done = True  # its chains carry their start values now
    return chain_values_to_keys(chains) if total else np.zeros(0, dtype=np.uint64)


def list_batch(plans: list[_Plan], keys: list[int], rows: dict) -> None:
    """Each plan's keys as a list into ``rows`` (rid -> keys) and its ``keys``: its donor's
    adopted leading keys (the donor's own int objects), then its own (``keys``: the batch's own
    keys as ints)."""
    for p in plans:
        p.keys = rows[p.rid] = row_of(p.donor.keys if p.donor is not None else None, p.adopted,
                                      keys[p.off:p.off + p.count])


def row_of(donor_keys: list[int] | None, adopted: int, own: list[int]) -> list[int]:
    """A request's keys: its donor's first ``adopted`` keys (the donor's own int objects, None:
    no donor), then ``own`` (a list the row may take over)."""
    if donor_keys is None:
        return own
    row = donor_keys[:adopted]
    row += own
    return row


__all__ = ["BATCH_PAGES", "build_rows", "key_batches", "list_batch", "row_of"]
