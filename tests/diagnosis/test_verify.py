"""``kvtrace verify``: no false alarm on healthy traces, planted faults found at their exact seq,
bad input refused with a clear message and a non-zero exit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from replay.cli import main
from replay.diagnosis import verify
from replay.diagnosis.make_incidents import INCIDENTS

DATA = Path(__file__).resolve().parents[2] / "data" / "incidents"
HEALTHY = [i.name for i in INCIDENTS if not i.cause]


def _copy(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(DATA / name, dest)
    return dest


def _rewrite(trace: Path, family: str, fn) -> None:
    """Apply ``fn`` to the family's (single) segment table and write it back with its metadata."""
    path = trace / family / "rank=0" / "part-00000.parquet"
    files = sorted((trace / family / "rank=0").glob("part-*.parquet"))
    tables = [pq.read_table(f) for f in files]
    t = pa.concat_tables(tables)
    for f in files:
        f.unlink()
    out = fn(t)
    pq.write_table(out.replace_schema_metadata(tables[0].schema.metadata), path)


def _renumber(trace: Path) -> None:
    """seq -> 2*seq in every family, so a row can be inserted between two."""
    for fam in ("request", "sched", "cache", "pool", "stats"):
        if (trace / fam).is_dir():
            _rewrite(trace, fam, lambda t: t.set_column(t.schema.get_field_index("seq"), "seq",
                                                        pa.compute.multiply(t.column("seq"), 2)))


def _rows(t: pa.Table, **eq) -> np.ndarray:
    m = np.ones(t.num_rows, bool)
    for k, v in eq.items():
        m &= np.asarray(t.column(k).cast(pa.string()).to_pylist() if isinstance(v, str) else t.column(k)) == v
    return np.flatnonzero(m)


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_traces_verify_ok(name):
    rep = verify(DATA / name)
    assert rep.level == "pages" and rep.verdict == "ok", rep.to_dict()
    assert rep.stats_rows_checked > 50 and rep.totals["page_ops"] > 100
    res = CliRunner().invoke(main, ["verify", str(DATA / name), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert {"events", "stats_rows_checked", "divergences", "first_divergence", "identity_violations",
            "double_frees", "drop_gaps", "verdict"} <= set(d) and d["verdict"] == "ok"


def _swa_free_row(t: pa.Table, k: int = 5) -> int:
    frees = _rows(t, pool="swa", op="free")
    return int(frees[k])


def test_dropped_free_pinpointed(tmp_path):
    tr = _copy("healthy_chat", tmp_path)
    t = pq.read_table(next((tr / "pool" / "rank=0").glob("*.parquet")))
    i = _swa_free_row(t)
    seq, rid, n = t.column("seq")[i].as_py(), t.column("rid")[i].as_py(), t.column("num_slots")[i].as_py()
    _rewrite(tr, "pool", lambda t: t.filter(pa.array(np.arange(t.num_rows) != i)))
    rep = verify(tr)
    f = rep.first_divergence
    assert rep.verdict == "diverged" and f["kind"] == "ledger_vs_stats" and f["pool"] == "swa"
    lo, hi = f["window"]
    assert lo < seq < hi and f["expected"] - f["found"] == -n  # the pool holds fewer than the ledger says
    assert rep.divergences[0]["seq"] == hi
    res = CliRunner().invoke(main, ["verify", str(tr)])
    assert res.exit_code == 1 and "Traceback" not in res.output and f"seq {hi}" in res.output
    assert rid >= 0


def test_duplicated_free_found_at_its_seq(tmp_path):
    tr = _copy("healthy_chat", tmp_path)
    _renumber(tr)
    t = pq.read_table(next((tr / "pool" / "rank=0").glob("*.parquet")))
    i = _swa_free_row(t)
    dup_seq = t.column("seq")[i].as_py() + 1
    row = t.slice(i, 1)
    row = row.set_column(row.schema.get_field_index("seq"), "seq", pa.array([dup_seq], pa.int64()))
    _rewrite(tr, "pool", lambda t: pa.concat_tables([t.slice(0, i + 1), row, t.slice(i + 1)]))
    rep = verify(tr)
    assert rep.double_frees and rep.double_frees[0]["seq"] == dup_seq
    assert rep.double_frees[0]["previous_op"]["seq"] == dup_seq - 1
    assert rep.first_divergence["seq"] == dup_seq and rep.verdict == "diverged"
    counts = verify(tr, pages=False)  # the count level sees it at the next stats row
    lo, hi = counts.first_divergence["window"]
    assert lo < dup_seq < hi


def test_corrupted_stats_row_found_at_its_seq(tmp_path):
    tr = _copy("healthy_long_prompts", tmp_path)
    t = pq.read_table(next((tr / "stats" / "rank=0").glob("*.parquet")))
    i = int(_rows(t, pool="swa")[20])
    seq = t.column("seq")[i].as_py()
    avail = t.column("available").to_numpy().copy()
    avail[i] -= 16
    _rewrite(tr, "stats", lambda t: t.set_column(t.schema.get_field_index("available"), "available",
                                                   pa.array(avail, pa.int64())))
    rep = verify(tr)
    assert [d["seq"] for d in rep.divergences] == [seq]
    assert rep.first_divergence["diff"] == 16 and rep.identity_violations[0]["seq"] == seq


@pytest.mark.parametrize("name", ["lost_free", "swa_mapping_race"])
def test_lost_pages_found_at_first_stats_row(name):
    rep = verify(DATA / name)
    assert rep.verdict == "leak" and rep.totals["divergences"] == 0  # recording sound, server leaked
    v = rep.identity_violations[0]
    assert v["pool"] == "swa" and v["unaccounted"] == 16  # one page
    # the first violation is the first row after the first lost page: every earlier row is whole
    import polars as pl

    t = pl.from_arrow(pq.read_table(next((DATA / name / "stats" / "rank=0").glob("*.parquet"))))
    t = t.filter(pl.col("pool").cast(pl.Utf8) == "swa").sort("seq")
    whole = (t["available"] + t["evictable"] + t["protected"] + t["held"] == t["capacity"]).to_numpy()
    assert t["seq"].to_numpy()[np.argmin(whole)] == v["seq"]
    res = CliRunner().invoke(main, ["verify", str(DATA / name)])
    assert res.exit_code == 1 and "identity" in res.output


def test_no_stats_family_is_refused(tmp_path):
    tr = _copy("healthy_chat", tmp_path)
    shutil.rmtree(tr / "stats")
    res = CliRunner().invoke(main, ["verify", str(tr)])
    assert res.exit_code == 2 and "no `stats` rows" in res.output and "Traceback" not in res.output


def test_newer_schema_is_refused(tmp_path):
    tr = _copy("healthy_chat", tmp_path)
    m = json.loads((tr / "manifest.json").read_text())
    m["schema_version"] = "2.0"
    (tr / "manifest.json").write_text(json.dumps(m))
    for cmd in ("verify", "doctor"):
        res = CliRunner().invoke(main, [cmd, str(tr)])
        assert res.exit_code == 2 and "schema_version 2.0 is not supported" in res.output


def test_drops_in_the_middle_are_gaps_not_leaks(tmp_path):
    from tracer.schema import FAMILIES

    tr = _copy("healthy_chat", tmp_path)
    t = pq.read_table(next((tr / "pool" / "rank=0").glob("*.parquet")))
    i = _swa_free_row(t, 10)
    seq = t.column("seq")[i].as_py()
    _rewrite(tr, "pool", lambda t: t.filter(pa.array(np.arange(t.num_rows) != i)))
    schema = FAMILIES["drops"].arrow_schema(stored=True)
    drops = pa.table({"ts_ns": [0], "seq": [seq], "family": ["pool"], "first_seq": [seq], "last_seq": [seq],
                      "num_events": [1], "reason": pa.array(["buffer_full"]).dictionary_encode().cast(schema.field("reason").type),
                      "detail": [""]}, schema=schema)
    (tr / "drops" / "rank=0").mkdir(parents=True, exist_ok=True)
    pq.write_table(drops, tr / "drops" / "rank=0" / "part-00000.parquet")
    rep = verify(tr)
    assert rep.verdict == "incomplete" and rep.totals["divergences"] == 0 and not rep.identity_violations
    assert rep.drop_gaps[0]["first_seq"] == seq
    res = CliRunner().invoke(main, ["verify", str(tr)])
    assert res.exit_code == 1 and "1 event lost" in res.output and "Traceback" not in res.output  # (plural right)
