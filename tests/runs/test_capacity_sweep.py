"""SWA-aware capacity curves (``replay.runs.capacity``, ``kvtrace capacity``): golden curves on the
bundled ``mixed`` workload (three SWA sizes, two full sizes), the facts that must hold (SWA used
within its pool, hits under the one-pass bound where nothing aborted), resume, refusals, the
``capacity_curve`` refusal naming the sweep, the CLI table and ``--json``, the figure and the report section."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from replay.analysis.capacity import capacity_curve
from replay.cli import main
from replay.runs.capacity import CAPACITY_FILE, COLUMNS, CapacitySweep, capacity_sweep, load_capacity
from replay.runs.summary import RunError

MIXED = "data/workloads/mixed"
MODEL = "mellum-like-swa"  # full 14,336, SWA 43,008 B/token
SWA_SIZES = (8192, 16384, 32768)


@pytest.fixture(scope="module")
def swa(tmp_path_factory):
    out = tmp_path_factory.mktemp("cap") / "swa"
    return out, capacity_sweep(MIXED, out, pool="swa", sizes_tokens=SWA_SIZES, model=MODEL, jobs=2)


@pytest.mark.timeout(240)
def test_swa_curve_golden(swa):
    out, res = swa
    assert isinstance(res, CapacitySweep) and res.config.pool == "swa"
    assert [r["size_tokens"] for r in res.rows] == list(SWA_SIZES) and all(r["status"] == "ok" for r in res.rows)
    # golden (reference backend, recorded policy, full pool 262,144): too small an SWA pool keeps
    # requests waiting (TTFT up) and their SWA pages from surviving (hits down); by 32,768 the
    # pool is not full (peak 21,520) and the curve has flattened at the default 65,536's figures
    assert [r["prefix_hit_ratio"] for r in res.rows] == [0.088729, 0.150971, 0.184289]
    assert [r["peak_swa_used"] for r in res.rows] == [8176, 16368, 21520]
    assert [r["ttft_p99_ms"] for r in res.rows] == [68245.511, 19957.825, 17399.948]
    assert [r["retractions"] for r in res.rows] == [0, 0, 0] and [r["aborted"] for r in res.rows] == [0, 0, 0]
    assert [r["size_gb"] for r in res.rows] == [round(s * 43008 / 1e9, 6) for s in SWA_SIZES]
    for r in res.rows:
        assert (r["full_pool_tokens"], r["swa_pool_tokens"], r["host_pool_tokens"]) == (262144, r["size_tokens"], 0)
        assert r["peak_swa_used"] <= r["size_tokens"] and r["mean_swa_used"] <= r["peak_swa_used"]
        assert r["finished"] == r["requests"] == 250
        # the full pool's one-pass LRU hit ratio bounds the device hits (no host pool, no aborts)
        assert r["one_pass_hit_ratio"] == 0.245385 and r["prefix_hit_ratio"] <= r["one_pass_hit_ratio"]
        assert r["host_hit_ratio"] == 0.0
    saved = json.loads((out / CAPACITY_FILE).read_text())
    assert saved == json.loads(json.dumps(res.to_dict(), default=str))
    assert load_capacity(out) == res and load_capacity(out / CAPACITY_FILE).config.sizes_tokens == SWA_SIZES
    assert saved["config"]["model"] == MODEL and saved["bytes_per_token"]["swa"] == 43008.0
    df = res.frame()
    assert tuple(df.columns) == COLUMNS and df.height == 3 and df["prefix_hit_ratio"].to_list()[0] == 0.088729


def test_a_capacity_sweep_resumes_and_adds_sizes(swa):
    out, res = swa
    summary = out / res.rows[0]["run"] / "summary.json"
    before = summary.stat().st_mtime_ns
    again = capacity_sweep(MIXED, out, pool="swa", sizes_tokens=SWA_SIZES + (65536,), model=MODEL, jobs=2)
    assert summary.stat().st_mtime_ns == before  # not replayed
    assert again.rows[:3] == res.rows
    # the default SWA pool (0.25 of 262,144) is not full at this load: the same figures as 32,768
    assert again.row(65536)["prefix_hit_ratio"] == 0.184289 and again.row(65536)["peak_swa_used"] == 21520
    with pytest.raises(KeyError, match="not swept"):
        again.row(12345)
    capacity_sweep(MIXED, out, pool="swa", sizes_tokens=SWA_SIZES, model=MODEL, jobs=2)  # leave it as it was


@pytest.mark.timeout(240)
def test_full_pool_sweep_with_its_one_pass_bound(tmp_path):
    res = capacity_sweep(MIXED, tmp_path / "f", pool="full", sizes_tokens=(262144, 524288), swa_pool_tokens=32768,
                         model=MODEL, jobs=2)
    assert [r["prefix_hit_ratio"] for r in res.rows] == [0.184289, 0.306731]
    assert [r["one_pass_hit_ratio"] for r in res.rows] == [round(capacity_curve(MIXED).at(s), 6)
                                                           for s in (262144, 524288)]
    for r in res.rows:
        assert r["aborted"] == 0 and r["prefix_hit_ratio"] <= r["one_pass_hit_ratio"]
        assert r["swa_pool_tokens"] == 32768 and r["size_gb"] == round(r["size_tokens"] * 14336 / 1e9, 6)


@pytest.mark.parametrize("kw, msg", [
    (dict(pool="swq", sizes_tokens=[8192]), r"--pool 'swq': unknown pool; known: full, swa, host"),
    (dict(sizes_tokens=[8190]), "not a whole number of pages of 16 tokens"),
    (dict(sizes_tokens=[0]), "positive whole number"), (dict(sizes_tokens=[-16]), "positive whole number"),
    (dict(sizes_tokens=[float("nan")]), "positive whole number"),
    (dict(sizes_tokens=[float("inf")]), "positive whole number"),
    (dict(sizes_tokens=["8k"]), "expected a number of tokens"), (dict(sizes_tokens=[]), "no sizes given"),
    (dict(sizes_tokens=[64]), "below the smallest swa pool a replay takes, 144 tokens"),
    (dict(sizes_tokens=[1 << 30]), "above the largest pool"),
    (dict(points=0), "--points 0"), (dict(points=3, max_tokens=-5), "--max-tokens -5"),
    (dict(sizes_tokens=[8192], full_pool_tokens=1000), "--full-pool-tokens 1000"),
    (dict(sizes_tokens=[8192], model="gpt-17"), "gpt-17"),
    (dict(sizes_tokens=[8192], model=None), "no bytes per token .* give --model NAME"),
    (dict(sizes_tokens=[8192], model="llama-3.1-8b"), "no bytes per token of the swa pool"),
    (dict(sizes_tokens=[8192], policy="nope"), "nope"),
])
def test_refusals_name_what_is_wrong(tmp_path, kw, msg):
    kw = {"model": MODEL} | kw
    with pytest.raises(RunError, match=msg):
        capacity_sweep(MIXED, tmp_path / "c", **kw)
    assert not (tmp_path / "c").exists()


def test_an_out_holding_another_capacity_sweep_is_refused(swa, tmp_path):
    out, _ = swa
    with pytest.raises(RunError, match="holds a capacity sweep with pool=swa, now host"):
        capacity_sweep(MIXED, out, pool="host", sizes_tokens=[8192], model=MODEL)
    with pytest.raises(RunError, match="full_pool_tokens=262144, now 131072"):
        capacity_sweep(MIXED, out, pool="swa", sizes_tokens=[8192], full_pool_tokens=131072, model=MODEL)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f.txt").write_text("mine")
    with pytest.raises(RunError, match="holds no sweep"):
        capacity_sweep(MIXED, tmp_path / "x", sizes_tokens=[8192], model=MODEL)


def test_default_sizes_are_log_spaced_pages_below_the_resolved_pool(tmp_path, monkeypatch):
    from replay.runs import capacity as C

    seen = {}

    def claim(out, cfg):  # stop before any replay: only the sizes are asked for
        seen["cfg"] = cfg
        raise RunError("stop")

    monkeypatch.setattr(C, "_claim", claim)
    with pytest.raises(RunError, match="stop"):
        capacity_sweep(MIXED, tmp_path / "d", pool="swa", points=5, model=MODEL)
    assert seen["cfg"].sizes_tokens == (4096, 8192, 16384, 32768, 65536)  # 65,536 / 16 .. 65,536
    seen.clear()
    with pytest.raises(RunError, match="stop"):
        capacity_sweep(MIXED, tmp_path / "d", pool="host", points=3, full_pool_tokens=65536, model=MODEL)
    assert seen["cfg"].sizes_tokens == (16384, 65536, 262144)  # no host pool recorded: up to four full pools


def test_capacity_curve_names_the_sweep_for_swa_and_host():
    with pytest.raises(ValueError, match=r"replay.runs.capacity.capacity_sweep\(source, out, pool='swa'"):
        capacity_curve(MIXED, pool="swa")
    with pytest.raises(ValueError, match="kvtrace capacity --pool swa.host"):
        capacity_curve(MIXED, pool="host")
    assert capacity_curve(MIXED).pool == "full"  # the one-pass curve unchanged


def test_cli_table_json_and_errors(swa, tmp_path):
    out, res = swa
    args = ["capacity", MIXED, "--pool", "swa", "--sizes", ",".join(map(str, SWA_SIZES)), "--model", MODEL,
            "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith(f"capacity {MIXED}: swa pool swept (full_pool_tokens 262,144, host_pool_tokens 0")
    assert lines[1].split() == ["tokens", "GB", "hit", "host", "hit", "ttft", "p50", "ttft", "p99", "retract",
                                "aborted", "peak", "swa", "mean", "swa", "1-pass"]
    assert lines[2].split()[:3] == ["8,192", "0.352", "0.089"] and lines[4].split()[-3] == "21,520"
    j = CliRunner().invoke(main, args + ["--json"])
    assert j.exit_code == 0 and json.loads(j.output)["rows"] == json.loads(json.dumps(res.to_dict()))["rows"]
    for bad, msg in ((["--sizes", "8192,abc"], "size 'abc'"), (["--sizes", "nan"], "positive whole number"),
                     (["--sizes", ","], "expected token counts"), (["--sizes", "8192", "--points", "3"], "not both"),
                     (["--pool", "swq", "--sizes", "8192"], "did you mean 'swa'"),
                     (["--points", "x"], "'x' is not a valid integer")):
        b = CliRunner().invoke(main, ["capacity", MIXED, *bad, "--model", MODEL, "--out", str(tmp_path / "b")])
        assert b.exit_code == 2 and msg in b.output and "Traceback" not in b.output, (bad, b.output)
    nomodel = CliRunner().invoke(main, ["capacity", MIXED, "--sizes", "8192", "--out", str(tmp_path / "b")])
    assert nomodel.exit_code == 2 and "give --model NAME" in nomodel.output and "Traceback" not in nomodel.output
    assert not (tmp_path / "b").exists()


def test_figure_and_report_section(swa, tmp_path):
    from replay.analysis.capacity_curves import capacity_figure
    from replay.report import build_report

    out, res = swa
    fig = capacity_figure(res)
    names = [t.name for t in fig.data]
    assert names[:2] == ["prefix-hit ratio", "one-pass LRU bound (at the full pool's 262,144 tokens)"]
    assert "TTFT p99 (ms)" in names and "peak SWA used" in names and "SWA pool size" in names
    assert list(fig.data[0].y) == [0.088729, 0.150971, 0.184289]
    assert fig.layout.xaxis3.ticktext[0] == "8,192<br>0.35 GB"
    rep = build_report(out, tmp_path / "r.html", diagnose=False)
    assert rep["capacity"] == {"pool": "swa", "sizes_tokens": list(SWA_SIZES), "rows": 3, "notes": []}
    page = (tmp_path / "r.html").read_text()
    assert "Capacity curves (swa pool)" in page and "<td>21,520</td>" in page


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_host_curve_counts_host_hits(tmp_path):
    # a full pool of 65,536 (13 of the 250 requests cannot fit it and abort) backed by a host pool
    res = capacity_sweep(MIXED, tmp_path / "h", pool="host", sizes_tokens=(65536, 262144), full_pool_tokens=65536,
                         swa_pool_tokens=32768, model=MODEL, jobs=2)
    assert [r["host_hit_ratio"] for r in res.rows] == [0.013646, 0.389132]
    assert [r["prefix_hit_ratio"] for r in res.rows] == [0.131303, 0.531345]
    assert [r["aborted"] for r in res.rows] == [13, 13] and any("aborted" in n for n in res.notes)
    # the prefix hits count the host hits: with a host pool they exceed the device-only one-pass bound
    assert all(r["one_pass_hit_ratio"] == 0.105371 for r in res.rows)
    assert res.rows[1]["prefix_hit_ratio"] > res.rows[1]["one_pass_hit_ratio"]
    # a host pool of H tokens holds H host_full and H host_swa rows (the generic host SWA pool)
    assert res.rows[0]["size_gb"] == round(65536 * (14336 + 43008) / 1e9, 6)
