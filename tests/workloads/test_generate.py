"""Generated workloads: determinism, format, and statistics within stated tolerances.

Tolerances (fixed seeds, so these are deterministic checks of the generator's calibration):
- request arrival rate within 8% of --qps (5000 requests; sampling sd is ~2-3%);
- output_len median within 10% of the shape's output_tokens_median;
- mean turns of complete sessions within 15% of mean_turns (geometric, capped);
- first-turn input median within 10% of system prompt + first_user_tokens_median.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from replay.workloads.errors import WorkloadError
from replay.workloads.generate import GenerateOptions, generate, generate_workload
from replay.workloads.shapes import SHAPES, get_shape, make_config
from replay.workloads.stats import workload_stats
from tracer.schema import MANIFEST_KEYS, REQUEST


def _files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_same_seed_gives_byte_identical_files(tmp_path):
    opts = GenerateOptions("mixed", 300, seed=7)
    a = _files(generate_workload(tmp_path / "a", opts))
    b = _files(generate_workload(tmp_path / "b", opts))
    assert list(a) == ["manifest.json", "request/rank=0/part-00000.parquet"]
    assert a == b
    c = _files(generate_workload(tmp_path / "c", GenerateOptions("mixed", 300, seed=8)))
    assert c["request/rank=0/part-00000.parquet"] != a["request/rank=0/part-00000.parquet"]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_shape_writes_a_valid_workload(shape, generated):
    w = generated(shape, 200, seed=2)
    assert sorted(w.manifest) == sorted(MANIFEST_KEYS)
    assert w.manifest["created_unix_ns"] == 0 and w.manifest["ranks"] == [0]
    assert w.manifest["workload"]["shape"] == shape
    assert w.manifest["workload"]["parameters"] == dict(vars(SHAPES[shape].config_cls()))
    part = w.path / "request" / "rank=0" / "part-00000.parquet"
    schema = pq.read_schema(part)
    assert schema.names == REQUEST.column_names
    assert str(schema.field("event").type) == "dictionary<values=string, indices=int8, ordered=0>"
    t = w.table
    assert t.num_rows == 200
    assert t.column("seq").to_pylist() == list(range(1, 201))
    assert t.column("rid").to_pylist() == list(range(200))
    assert set(t.column("event").to_pylist()) == {"arrival"}
    c = w.columns
    assert np.all(np.diff(c.ts_ns) >= 0) and c.ts_ns[0] >= 0
    assert np.all(c.output_len >= 1) and np.all(c.output_len <= c.max_new_tokens)
    assert np.all(np.diff(c.hash_offsets) == c.input_len // w.hash_block_tokens)


def test_multi_turn_turns_extend_the_previous_prompt(generated):
    w = generated("multi_turn", 500, seed=1)
    c = w.columns
    by_session = {}
    for i in range(c.num_requests):
        by_session.setdefault(int(c.session_id[i]), []).append(i)
    checked = 0
    for rows in by_session.values():
        turns = c.turn[rows]
        assert np.all(np.diff(turns) == 1)  # consecutive turns, in arrival order
        for a, b in zip(rows, rows[1:]):
            ha, hb = c.hashes_of(a), c.hashes_of(b)
            assert c.input_len[b] >= c.input_len[a] + c.output_len[a] + 1
            assert hb[: len(ha)].tolist() == ha.tolist()
            checked += 1
    assert checked > 100
    # different sessions share at most their system prompt: never a block past 4096 tokens
    first = {}
    for i in range(c.num_requests):
        for k, h in enumerate(c.hashes_of(i).tolist()):
            s = first.setdefault(h, int(c.session_id[i]))
            if s != c.session_id[i]:
                assert k < 4096 // w.hash_block_tokens


def test_multi_turn_statistics_match_parameters(generated):
    cfg = get_shape("multi_turn").config_cls()
    w = generated("multi_turn", 5000, seed=11)
    s = workload_stats(w)
    assert s["arrival_rate_per_s"] == pytest.approx(3.4, rel=0.08)
    assert s["output_len_p50"] == pytest.approx(cfg.output_tokens_median, rel=0.10)
    c = w.columns
    t_end = c.ts_ns[-1]
    sessions = {}
    for i in range(c.num_requests):
        sessions.setdefault(int(c.session_id[i]), []).append(i)
    # sessions that started inside the window early enough to be complete
    complete = [r for r in sessions.values() if c.turn[r[0]] == 0 and c.ts_ns[r[0]] < t_end / 2]
    assert len(complete) > 300
    assert np.mean([len(r) for r in complete]) == pytest.approx(cfg.mean_turns, rel=0.15)


def test_first_turn_length_matches_parameters(generated):
    shape = get_shape("multi_turn")
    cfg = make_config(shape, {"system_prompt_tokens_min": "500", "system_prompt_tokens_max": "500"})
    cols, _ = generate(GenerateOptions("multi_turn", 3000, seed=5), cfg)
    first = cols.input_len[cols.turn == 0]
    assert np.median(first) == pytest.approx(500 + cfg.first_user_tokens_median, rel=0.10)


def test_agentic_contexts_grow_within_32k_128k(generated):
    w = generated("agentic", 400, seed=3)
    c = w.columns
    assert c.input_len.min() >= 32768 and c.input_len.max() <= 131072
    assert np.median(c.output_len) == pytest.approx(150, rel=0.15)
    for sid in np.unique(c.session_id):
        rows = np.flatnonzero(c.session_id == sid)
        assert np.all(np.diff(c.input_len[rows]) > 0)  # tool outputs appended every step
    assert workload_stats(w)["ideal_reuse_ratio"] > 0.8


def test_long_context_prompts_exceed_chunked_prefill(generated):
    cfg = get_shape("long_context").config_cls()
    c = generated("long_context", 300, seed=3).columns
    assert c.input_len.min() > 1.5 * cfg.chunked_prefill_size
    assert c.input_len.max() <= cfg.max_context_tokens


def test_shared_prefix_requests_share_a_few_prefixes(generated):
    w = generated("shared_prefix", 400, seed=3)
    c = w.columns
    firsts = {int(c.hashes_of(i)[0]) for i in range(c.num_requests)}
    assert len(firsts) <= get_shape("shared_prefix").config_cls().num_prefixes
    assert len(np.unique(c.session_id)) == c.num_requests
    assert workload_stats(w)["ideal_reuse_ratio"] > 0.8


def _request_gap_cv(w):
    gaps = np.diff(w.columns.ts_ns).astype(float)
    return gaps.std() / gaps.mean()


def test_arrival_processes(generated):
    poisson = generated("shared_prefix", 4000, seed=6)  # one request per unit: request gaps ~ Exp
    assert _request_gap_cv(poisson) == pytest.approx(1.0, abs=0.1)
    assert workload_stats(poisson)["arrival_rate_per_s"] == pytest.approx(5.0, rel=0.08)
    bursty = generated("shared_prefix", 4000, seed=6, arrival="gamma", arrival_cv=2.5)
    assert _request_gap_cv(bursty) > 2.0
    assert workload_stats(bursty)["arrival_rate_per_s"] == pytest.approx(5.0, rel=0.15)
    mixed = generated("mixed", 3000, seed=6)
    assert mixed.manifest["workload"]["arrival"] == {"kind": "gamma", "cv": 2.0}
    assert _request_gap_cv(mixed) > 1.3


def test_mixed_request_shares_follow_weights(generated):
    c = generated("mixed", 3000, seed=9).columns
    agentic = np.mean(c.input_len >= 32768)  # agentic + long documents
    assert 0.10 < agentic < 0.35


def test_cold_start_begins_with_first_turns():
    cols, wl = generate(GenerateOptions("multi_turn", 200, seed=1, warm_start=False))
    assert wl["warmup_s"] == 0.0
    first_seen = {}
    for i, s in enumerate(cols.session_id.tolist()):
        first_seen.setdefault(s, int(cols.turn[i]))
    assert set(first_seen.values()) == {0}


def test_bad_options_fail_clearly():
    with pytest.raises(WorkloadError, match="unknown shape 'chat'; known shapes: multi_turn, agentic"):
        generate(GenerateOptions("chat", 10))
    with pytest.raises(WorkloadError, match="has no parameter 'turns'; known: num_system_prompts"):
        make_config(get_shape("multi_turn"), {"turns": "3"})
    with pytest.raises(WorkloadError, match="cannot parse 'x' as float"):
        make_config(get_shape("multi_turn"), {"mean_turns": "x"})
    with pytest.raises(WorkloadError, match="--requests must be >= 1"):
        generate(GenerateOptions("multi_turn", 0))
