"""Schema 1.2 positions storage (``kvtrace compact``): exact, refused when it cannot be, and
readers (workload stats, replay) see what they saw before."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings

import tracer
from replay.cli import main
from replay.compact import CompactError, compact_trace, same_partition
from replay.trace import open_trace
from replay.workloads.io import write_workload
from replay.workloads.read import read_workload
from tests.workloads import test_prefixes as tp
from tracer.schema import SCHEMA_VERSION, RequestEvent
from tracer.schema.prefixes import SALT_META, PrefixIndex, synth_values


def _arrival_chains(path) -> list[list[int]]:
    t = open_trace(path).table("request").sort_by("seq")
    return [h for h, e in zip(t.column("page_hashes").to_pylist(), t.column("event").to_pylist())
            if e == "arrival" and h is not None]


def _common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _assert_same_structure(before, after):
    """For every pair of requests, the same common-prefix length; equal lengths per request."""
    assert [len(c) for c in before] == [len(c) for c in after]
    for i in range(len(before)):
        for j in range(i + 1):
            assert _common_prefix(before[i], before[j]) == _common_prefix(after[i], after[j]), (i, j)


def _recorded(path, lists):
    """Arrival rows as the hooks write them (streaming PrefixIndex, schema 1.1 rows)."""
    tracer.start(path, hash_block_tokens=16)
    idx = PrefixIndex(1 << 8)
    for i, h in enumerate(lists):
        prid, pblk, new = idx.encode(i, np.array(h, np.uint64))
        tracer.request(RequestEvent.ARRIVAL, i, 1, i, 16 * len(h) + 3, 4, 8, -1, f"r{i}", new, prid, pblk)
        tracer.request(RequestEvent.FINISH, i, 1, i, 16 * len(h) + 3, 4, 8, 0, f"r{i}", None)
    tracer.stop()
    return path


# ------------------------------------------------------------------------------ exactness
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tp.session_trees())
def test_compacted_session_tree_keeps_every_common_prefix(tmp_path_factory, keys):
    d = tmp_path_factory.mktemp("c")
    flat, offsets = tp._flat(keys)
    before = tp._chains(flat, offsets)
    src = _recorded(d / "src", before)
    res = compact_trace(src, d / "out")
    after = _arrival_chains(d / "out")
    _assert_same_structure(before, after)
    values = np.array([x for c in after for x in c], np.uint64)
    assert len(np.unique(values)) == res.distinct_blocks == len(np.unique(flat))  # unique per block
    raw = pq.read_table(d / "out" / "request" / "rank=0" / "part-00000.parquet")
    assert sum(len(h or []) for h in raw.column("page_hashes").to_pylist()) == 0  # no hash stored
    assert raw.column("tip_hash").to_pylist()[::2] == [c[-1] if c else 0 for c in before]
    assert raw.column("new_blocks").to_pylist()[1::2] == [-1] * len(keys)  # finish rows: no chain


def test_synthesized_values_are_a_bijection_of_seq_and_block():
    seqs = np.repeat(np.arange(1, 2001, dtype=np.int64), 50)
    pos = np.tile(np.arange(50, dtype=np.int64), 2000)
    v = synth_values(7, 0, seqs, pos)
    assert len(np.unique(v)) == 100_000
    assert not np.array_equal(v, synth_values(8, 0, seqs, pos))  # the salt changes them
    assert not np.array_equal(v, synth_values(7, 1, seqs, pos))  # and the rank
    assert synth_values(7, 0, [5], [3]).tolist() == synth_values(7, 0, [5], [3]).tolist()
    with pytest.raises(ValueError, match="seq 1099511627776 outside"):
        synth_values(7, 0, [1 << 40], [0])


def test_same_partition():
    assert same_partition(np.array([1, 2, 1, 3]), np.array([9, 8, 9, 7]))
    assert not same_partition(np.array([1, 2, 3]), np.array([5, 6, 5]))  # b merges two a-groups
    assert not same_partition(np.array([1, 1]), np.array([5, 6]))  # b splits an a-group
    assert same_partition(np.array([], np.uint64), np.array([], np.uint64))


# ------------------------------------------------------------------------------ readers unchanged
def test_workload_stats_and_rows_equal_after_compaction(tmp_path):
    src = "data/workloads/multi_turn"
    res = compact_trace(src, tmp_path / "c")
    run = CliRunner().invoke
    a = json.loads(run(main, ["workload", "stats", "--json", src]).output)
    b = json.loads(run(main, ["workload", "stats", "--json", str(tmp_path / "c")]).output)
    assert a == b
    wa, wb = read_workload(src), read_workload(tmp_path / "c")
    ca, cb = wa.columns, wb.columns
    for f in ("ts_ns", "session_id", "turn", "input_len", "output_len", "max_new_tokens", "hash_offsets"):
        assert np.array_equal(getattr(ca, f), getattr(cb, f)), f
    assert same_partition(ca.page_hashes, cb.page_hashes)
    assert (res.rows, res.arrivals, res.blocks, res.distinct_blocks) == (500, 500, 284_418, 93_449)
    assert res.hashes_stored_before == 93_449
    assert res.request_bytes_after < 0.05 * res.request_bytes_before
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert m["chain_storage"] == "positions" and m["schema_version"] == SCHEMA_VERSION
    meta = pq.read_schema(tmp_path / "c" / "request" / "rank=0" / "part-00000.parquet").metadata
    assert int(meta[SALT_META]) > 0
    # every reader path sees the same chains
    tr = open_trace(tmp_path / "c")
    t = tr.table("request").sort_by("seq")
    assert tr.lazy("request").sort("seq").collect()["page_hashes"].to_list() == t.column("page_hashes").to_pylist()
    assert [e.row["page_hashes"] for e in tr.events(0, ("request",))] == t.column("page_hashes").to_pylist()


@pytest.mark.sglang
def test_replay_of_compacted_workload_gives_the_same_summary(tmp_path):
    from replay.runs import MEASURED, replay_run
    from tests.runs.conftest import SMALL, multi_turn_rows
    from replay.backends.sglang import write_workload as write_rows

    w = write_rows(tmp_path / "w", multi_turn_rows(), hash_block_tokens=16)
    compact_trace(w, tmp_path / "wc")
    a = replay_run(w, tmp_path / "a", policy="swa-fixes", sets=SMALL).to_dict()
    b = replay_run(tmp_path / "wc", tmp_path / "b", policy="swa-fixes", sets=SMALL).to_dict()
    for k in ("run", "source", *MEASURED):  # the run's and the source's paths; measured CPU
        a.pop(k), b.pop(k)
    assert a == b and a["finished"] == 12 and a["prefix_hit_ratio"] > 0
    # the run itself (a trace recorded by the hooks through the real backend) compacts in place
    before = _arrival_chains(tmp_path / "a")
    res = compact_trace(tmp_path / "a", in_place=True)
    _assert_same_structure(before, _arrival_chains(tmp_path / "a"))
    assert (tmp_path / "a" / "summary.json").is_file() and res.arrivals == 12
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".compact-")]
    assert open_trace(tmp_path / "a").check() == []


@pytest.mark.slow
@pytest.mark.sglang
def test_multi_turn_recorded_through_the_real_backend_compacts_exactly(tmp_path):
    """The committed multi_turn sample replayed on the real sglang classes: the run's request rows
    are the hooks' (streaming PrefixIndex); compacted, every block slot (request, position) equals
    the same others as before, so every pair of requests keeps its common-prefix length."""
    from replay.runs import replay_run

    replay_run("data/workloads/multi_turn", tmp_path / "run", policy="swa-fixes")
    before = _arrival_chains(tmp_path / "run")
    res = compact_trace(tmp_path / "run", tmp_path / "c")
    after = _arrival_chains(tmp_path / "c")
    assert [len(c) for c in before] == [len(c) for c in after]
    flat_b = np.array([x for c in before for x in c], np.uint64)
    flat_a = np.array([x for c in after for x in c], np.uint64)
    assert same_partition(flat_b, flat_a)  # => the same common prefix for every pair
    _assert_same_structure(before[:80], after[:80])  # and spelled out on the first 80
    assert (res.arrivals, res.blocks, res.distinct_blocks) == (500, 284_418, 93_449)
    assert len(np.unique(flat_a)) == 93_449
    assert res.request_bytes_after < 0.1 * res.request_bytes_before


# ------------------------------------------------------------------------------ refusals
def test_refusals_change_nothing(tmp_path):
    run = CliRunner().invoke
    src = _recorded(tmp_path / "src", [[1, 2], [1, 2, 3]])
    res = run(main, ["compact", str(src)])
    assert res.exit_code == 2 and "give exactly one of --out DIR and --in-place" in res.output
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    res = run(main, ["compact", str(src), "--out", str(tmp_path / "busy")])
    assert res.exit_code == 2 and "not a kvtrace trace or workload" in res.output
    res = run(main, ["compact", str(src), "--in-place", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["distinct_blocks"] == 3
    res = run(main, ["compact", str(src), "--in-place"])
    assert res.exit_code == 2 and "already compacted" in res.output
    # hashes that are not chained: equal values with different prefixes
    bad = tmp_path / "bad"
    write_workload(bad, _unchained(), 16, {"shape": "t"})
    before = sorted(p.name for p in (tmp_path / "bad").rglob("*"))
    res = run(main, ["compact", str(bad), "--in-place"])
    assert res.exit_code == 2 and "equal page hashes at different prefixes" in res.output
    assert sorted(p.name for p in (tmp_path / "bad").rglob("*")) == before


def _unchained():
    import dataclasses

    cols = tp._cols([[1, 2], [3, 4]])
    return dataclasses.replace(cols, page_hashes=np.array([1, 2, 3, 2], np.uint64))


def test_blocks_shared_across_ranks_are_refused(tmp_path):
    from tracer.schema.storage import write_family_table

    src = _recorded(tmp_path / "src", [[1, 2], [1, 2, 3]])
    t = pq.read_table(src / "request" / "rank=0" / "part-00000.parquet")
    write_family_table(src, "request", t, rank=1, part=0)
    with pytest.raises(CompactError, match="block hashes occur on both rank 0 and rank 1"):
        compact_trace(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_expanding_a_compacted_table_twice_changes_nothing(tmp_path):
    compact_trace(_recorded(tmp_path / "src", [[1, 2], [1, 2, 3], [4]]), tmp_path / "c")
    from tracer.schema.prefixes import expand_request_table

    once = open_trace(tmp_path / "c").table("request").drop_columns(["rank"])
    twice, problems = expand_request_table(once)
    assert twice.equals(once) and problems == []
    assert pa.compute.max(once.column("new_blocks")).as_py() == -1


def test_a_failed_verification_leaves_the_trace_as_it_was(tmp_path, monkeypatch):
    import replay.compact as compact

    src = _recorded(tmp_path / "src", [[1, 2], [1, 2, 3]])
    files = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}

    def fail(path, orig, rank):
        raise CompactError(f"{path}: planted")

    monkeypatch.setattr(compact, "_verify", fail)
    with pytest.raises(CompactError, match="planted"):
        compact_trace(src, in_place=True)
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file()} == files  # no staging left
    with pytest.raises(CompactError, match="planted"):
        compact_trace(src, tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["src"]
