"""Mooncake/Bailian import golden tests, malformed lines, atomic writes, round trips."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replay.workloads.bailian import import_bailian
from replay.workloads.errors import FormatError, WorkloadError
from replay.workloads.hashing import chain_one
from replay.workloads.io import read_workload
from replay.workloads.mooncake import export_mooncake, import_mooncake


def _hashes(w):
    c = w.columns
    return [c.hashes_of(i).tolist() for i in range(c.num_requests)]


def test_mooncake_golden(tmp_path, fixture_path):
    w = read_workload(import_mooncake(fixture_path("mooncake_small.jsonl"), tmp_path / "W"))
    c = w.columns
    assert w.hash_block_tokens == 512
    assert w.manifest["producer"]["source"] == "workload"
    assert w.manifest["workload"]["source"] == "mooncake"
    # stable sort by timestamp: file lines 1, 2, 4, 3, 6(blank skipped: line 6 is line 5's slot), 7
    assert c.ts_ns.tolist() == [0, 0, 1_000_000_000, 1_500_000_000, 3_000_000_000, 3_000_000_000]
    assert c.input_len.tolist() == [1100, 1536, 2100, 600, 300, 1024]
    assert c.output_len.tolist() == [20, 5, 100, 7, 1, 9]
    assert c.max_new_tokens.tolist() == [20, 5, 100, 7, 1, 9]
    assert c.session_id.tolist() == [-1] * 6 and c.turn.tolist() == [-1] * 6
    assert w.table.column("rid").to_pylist() == list(range(6))
    assert w.table.column("seq").to_pylist() == list(range(1, 7))
    assert w.table.column("cached_len").to_pylist() == [-1] * 6
    h = _hashes(w)
    # only full 512-token blocks are hashed: prefix nodes (id + everything before it) numbered
    # in order of first appearance, then chained; 1 and 2 after 5 are new nodes
    assert h[0] == chain_one([0, 1]).tolist()
    assert h[1] == chain_one([0, 1, 2]).tolist()
    assert h[2] == chain_one([3, 4, 5, 6]).tolist()
    assert h[3] == chain_one([0]).tolist()
    assert h[4] == []
    assert h[5] == h[0]
    # prefix sharing: equal prefixes share, ids 1, 2 after a different first block do not
    assert h[1][:2] == h[0] and h[3] == h[0][:1]
    assert not set(h[2]) & set(h[0] + h[1] + h[3])


def test_bailian_golden_sessions_turns_and_prefix_sharing(tmp_path, fixture_path):
    w = read_workload(import_bailian(fixture_path("bailian_small.jsonl"), tmp_path / "W"))
    c = w.columns
    assert w.hash_block_tokens == 16
    assert w.manifest["workload"]["request_types"] == {"image": 1, "search": 1, "text": 3}
    assert c.ts_ns.tolist() == [500_000_000, 1_250_000_000, 4_000_000_000, 9_750_000_000, 10_000_000_000]
    assert c.rid_str == ["10", "11", "12", "13", "20"]
    assert c.session_id.tolist() == [0, 1, 0, 0, 2]  # 12 -> 10, 13 -> 12 -> 10; 20's parent 99 absent
    assert c.turn.tolist() == [0, 0, 1, 2, 3]
    h = _hashes(w)
    assert [len(x) for x in h] == [2, 1, 4, 6, 2]  # partial last 16-token blocks dropped
    assert h[2][:2] == h[0]  # turn 2 extends turn 1 (turn 1's partial block 3 not hashed)
    assert h[3][:4] == h[2]  # turn 3 extends turn 2
    assert h[1] == h[0][:1]  # shared first block (system prompt) across sessions
    assert h[4] == h[0]  # same ids in the same order: same prefix, same hashes


def test_malformed_line_names_file_line_and_field(tmp_path, fixture_path):
    src = fixture_path("mooncake_bad_field.jsonl")
    with pytest.raises(FormatError) as e:
        import_mooncake(src, tmp_path / "W")
    assert str(e.value) == f"{src}:3: field 'input_length': expected an integer, got \"abc\""
    assert (e.value.line, e.value.field) == (3, "input_length")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary left behind


def test_invalid_json_line(tmp_path, fixture_path):
    src = fixture_path("mooncake_bad_json.jsonl")
    with pytest.raises(FormatError, match=r"mooncake_bad_json.jsonl:2: invalid JSON \(Expecting ',' delimiter\)"):
        import_mooncake(src, tmp_path / "W")
    assert list(tmp_path.iterdir()) == []


def test_block_ids_must_cover_the_input(tmp_path, fixture_path):
    src = fixture_path("bailian_bad_hash_ids.jsonl")
    with pytest.raises(FormatError) as e:
        import_bailian(src, tmp_path / "W")
    assert str(e.value) == (
        f"{src}:2: field 'hash_ids': 2 block ids do not match input_length 70 "
        "(expected 4 to 5 ids of 16-token blocks)"
    )


@pytest.mark.parametrize(
    "record, field, problem",
    [
        ({"timestamp": -1}, "timestamp", "expected a non-negative number, got -1"),
        ({"output_length": True}, "output_length", "expected an integer, got true"),
        ({"hash_ids": [0, -3]}, "hash_ids", "element 1: expected an integer in [0, 2**64), got -3"),
        ({"hash_ids": None}, "hash_ids", "expected a list of block ids, got null"),
    ],
)
def test_mooncake_field_errors(tmp_path, record, field, problem):
    base = {"timestamp": 0, "input_length": 600, "output_length": 7, "hash_ids": [0, 4]}
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps(base) + "\n" + json.dumps({**base, **record}) + "\n")
    with pytest.raises(FormatError) as e:
        import_mooncake(src, tmp_path / "W")
    assert str(e.value) == f"{src}:2: field '{field}': {problem}"


def test_missing_field_and_bailian_structure_errors(tmp_path):
    src = tmp_path / "b.jsonl"
    row = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 1, "output_length": 1,
           "turn": 1, "hash_ids": []}
    src.write_text(json.dumps(row) + "\n" + json.dumps({k: v for k, v in {**row, "chat_id": 2}.items() if k != "timestamp"}) + "\n")
    with pytest.raises(FormatError, match=r"b.jsonl:2: field 'timestamp': missing$"):
        import_bailian(src, tmp_path / "W")
    src.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(FormatError, match=r"b.jsonl:2: field 'chat_id': duplicate id 1 \(first on line 1\)"):
        import_bailian(src, tmp_path / "W")
    cyc = [{**row, "chat_id": 1, "parent_chat_id": 2}, {**row, "chat_id": 2, "parent_chat_id": 1}]
    src.write_text("".join(json.dumps(r) + "\n" for r in cyc))
    with pytest.raises(FormatError, match=r"b.jsonl:1: field 'parent_chat_id': cycle through chat 1"):
        import_bailian(src, tmp_path / "W")
    src.write_text("\n")
    with pytest.raises(WorkloadError, match="no requests"):
        import_bailian(src, tmp_path / "W")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jsonl"]


def test_existing_output_is_refused_then_replaced_with_force(tmp_path, fixture_path):
    out = tmp_path / "W"
    import_mooncake(fixture_path("mooncake_small.jsonl"), out)
    with pytest.raises(WorkloadError, match="already exists"):
        import_mooncake(fixture_path("mooncake_small.jsonl"), out)
    import_bailian(fixture_path("bailian_small.jsonl"), out, overwrite=True)
    assert read_workload(out).hash_block_tokens == 16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["W"]


def test_mooncake_round_trip_import_export_import(tmp_path, fixture_path):
    w1 = read_workload(import_mooncake(fixture_path("mooncake_small.jsonl"), tmp_path / "W1"))
    f = export_mooncake(tmp_path / "W1", tmp_path / "out.jsonl")
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    assert lines[0] == {"timestamp": 0, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 2]}
    assert lines[1]["hash_ids"] == [0, 1, 3]  # 1536 tokens: three full blocks, no tail id
    assert lines[5]["hash_ids"] == [0, 1]
    w2 = read_workload(import_mooncake(f, tmp_path / "W2"))
    assert w2.table.equals(w1.table)
    # a second export is the same file
    assert export_mooncake(tmp_path / "W2", tmp_path / "out2.jsonl").read_bytes() == f.read_bytes()


def test_export_of_generated_workload_keeps_prefix_structure(tmp_path, generated):
    w = generated("multi_turn", 300, seed=4)
    f = export_mooncake(w.path, tmp_path / "g.jsonl", with_sessions=True)
    w2 = read_workload(import_mooncake(f, tmp_path / "G"))
    c, c2 = w.columns, w2.columns
    assert c2.input_len.tolist() == c.input_len.tolist()
    assert c2.ts_ns.tolist() == (c.ts_ns // 1_000_000 * 1_000_000).tolist()
    assert len(np.unique(c2.session_id)) == len(np.unique(c.session_id))

    def common(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    group = 512 // w.hash_block_tokens
    rng = np.random.default_rng(0)
    for i, j in rng.integers(0, c.num_requests, size=(300, 2)):
        fine = common(c.hashes_of(i), c.hashes_of(j)) // group
        coarse = common(c2.hashes_of(i), c2.hashes_of(j))
        assert coarse == fine, (i, j)


def test_export_rejects_incompatible_block_size(tmp_path, fixture_path):
    import_mooncake(fixture_path("mooncake_small.jsonl"), tmp_path / "W")
    with pytest.raises(WorkloadError, match="must be a multiple of it"):
        export_mooncake(tmp_path / "W", tmp_path / "x.jsonl", block_tokens=256)
