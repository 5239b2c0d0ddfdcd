"""GB beside tokens: model presets (``replay.models``), where a run's bytes per token come from
(``replay.runs.kv_gb``: trace / preset / none) and the summary's GB figures (golden on the
bundled A/B run ``data/traces/ab/baseline``; a replay with ``--model``; compare's GB columns)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.runs.conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]
AB = ROOT / "data" / "traces" / "ab" / "baseline"


def test_presets_follow_sglangs_cell_formulas():
    from replay.models import PRESETS, dsv4_bytes_per_token, preset

    assert preset("llama-3.1-8b").bytes_per_token == {"full": 131072.0, "swa": None, "host_full": 131072.0,
                                                      "host_swa": None}  # 8 x (128+128) x 32 x 2
    m = preset("mellum-like-swa").bytes_per_token
    assert (m["full"], m["swa"]) == (4 * 256 * 7 * 2, 4 * 256 * 21 * 2) == (14336.0, 43008.0)
    assert m["host_full"] == m["full"] and m["host_swa"] == m["swa"]
    tiny = preset("dsv4-tiny").bytes_per_token
    # kv slot 584 B; full: 2 c4 layers (584/4 + 132/4), 1 c128 (584/128 + 2*512*4); swa: 4 x 584 + 2 c4 states
    assert tiny["full"] == 2 * 584 / 4 + 584 / 128 + 2 * 132 / 4 + 4096 == 4458.5625
    assert tiny["swa"] == 4 * 584 + 2 * (8 / 128) * (4 * 512 * 4 + 4 * 128 * 4) == 3616.0
    big = preset("deepseek-v4-class").bytes_per_token
    assert big == {"full": 128386.875, "swa": 55408.0, "host_full": None, "host_swa": None}
    assert dsv4_bytes_per_token(compress_ratios=[0, 4, 128, 4], online_c128=True)["full"] == pytest.approx(
        2 * 584 / 4 + 584 / 128 + 2 * 132 / 4 + 3 * 512 * 4 / 128)
    assert all(p.to_dict()["layout"]["kind"] in ("mha", "hybrid_swa", "dsv4") for p in PRESETS.values())


def test_unknown_preset_names_the_known_ones():
    from replay.models import ModelError, preset

    with pytest.raises(ModelError, match="known: llama-3.1-8b, mellum-like-swa"):
        preset("gpt-5")


def _trace_with_bytes(tmp_path: Path, pools: dict) -> Path:
    t = tmp_path / "capture"
    shutil.copytree(ROOT / "data" / "traces" / "workload", t)
    (t / "ranks").mkdir(exist_ok=True)
    (t / "ranks" / "rank=0.json").write_text(json.dumps({"state": "complete", "kv_bytes": {
        "kv_pool": "SWAKVPool", "pools": {k: {"bytes_per_token": v} for k, v in pools.items()}}}))
    return t


def test_bytes_come_from_the_trace_else_the_preset_else_none(tmp_path):
    from replay.runs.kv_gb import resolve_bytes

    plain = ROOT / "data" / "traces" / "workload"
    assert resolve_bytes(plain) == {"source": "none", "model": None, "bytes_per_token": {}}
    got = resolve_bytes(plain, "llama-3.1-8b")
    assert got["source"] == "preset" and got["model"] == "llama-3.1-8b" and not got["trace_had_bytes"]
    cap = _trace_with_bytes(tmp_path, {"full": 100.0, "swa": 50.0})
    assert resolve_bytes(cap) == {"source": "trace", "model": None, "bytes_per_token": {"full": 100.0, "swa": 50.0}}
    over = resolve_bytes(cap, "dsv4-tiny")
    assert over["source"] == "preset" and over["trace_had_bytes"] and over["bytes_per_token"]["full"] == 4458.5625
    # a run: its run block is the answer (its rank entries describe the replay's stand-in pools)
    assert resolve_bytes(AB)["source"] == "none"


def test_gb_figures_golden_on_the_bundled_run():
    from replay.runs.kv_gb import GB_FIGURES, gb_figures

    got = gb_figures(AB, {"full": 14336.0, "swa": 43008.0, "host_full": 14336.0, "host_swa": 43008.0})
    assert got == {"full_pool_gb": 0.939524, "peak_full_used_gb": 0.939524, "mean_full_used_gb": 0.795924,
                   "swa_pool_gb": 0.704643, "peak_swa_used_gb": 0.704643, "mean_swa_used_gb": 0.567653,
                   "host_pool_gb": 3.289252, "peak_host_full_used_gb": 1.878819, "peak_host_swa_used_gb": 1.409974}
    s = json.loads((AB / "summary.json").read_text())  # the same tokens the summary reports
    assert got["peak_swa_used_gb"] == round(s["peak_swa_used"] * 43008 / 1e9, 6)
    assert got["mean_swa_used_gb"] == pytest.approx(s["mean_swa_used"] * 43008 / 1e9, abs=1e-6)
    # a pool without bytes has no GB figure; no bytes at all: every figure None
    part = gb_figures(AB, {"full": 14336.0})
    assert part["peak_full_used_gb"] == 0.939524 and part["peak_swa_used_gb"] is None and part["host_pool_gb"] is None
    assert gb_figures(AB, {}) == dict.fromkeys(GB_FIGURES)


@pytest.mark.sglang
def test_replay_with_a_model_preset_reports_gb_and_records_the_source(small_workload, tmp_path):
    from click.testing import CliRunner

    from replay.cli import main
    from replay.runs import replay_run
    from replay.runs.compare import compare, format_table
    from tracer.schema.manifest import read_manifest

    out = tmp_path / "runs" / "m"
    r = CliRunner().invoke(main, ["replay", str(small_workload), "--policy", "swa-fixes", "--out", str(out),
                                  "--model", "mellum-like-swa", "--json", *sum((["--set", x] for x in SMALL), [])])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output.strip().splitlines()[-1])
    assert s["kv_bytes"]["source"] == "preset" and s["kv_bytes"]["model"] == "mellum-like-swa"
    assert s["peak_swa_used_gb"] == round(s["peak_swa_used"] * 43008 / 1e9, 6)
    assert s["peak_full_used_gb"] == round(s["peak_full_used"] * 14336 / 1e9, 6)
    assert s["full_pool_gb"] == round(16384 * 14336 / 1e9, 6)
    assert read_manifest(out)["run"]["kv_bytes"]["source"] == "preset"
    # a replay of the run keeps the run's bytes (source trace); a run without any: none, no GB
    again = replay_run(out, tmp_path / "runs" / "again", policy="recorded")
    assert again.kv_bytes["source"] == "trace" and again.peak_swa_used_gb is not None
    plain = replay_run(small_workload, tmp_path / "plain", policy="swa-fixes", sets=SMALL)
    assert plain.kv_bytes["source"] == "none" and plain.peak_swa_used_gb is None
    df = compare(tmp_path / "runs")
    assert "peak_swa_used_gb" in format_table(df, width=400)
    bad = CliRunner().invoke(main, ["replay", str(small_workload), "--out", str(tmp_path / "x"), "--model", "nope"])
    assert bad.exit_code != 0 and "known: llama-3.1-8b" in bad.output and "Traceback" not in bad.output


@pytest.mark.sglang
def test_sweep_model_reaches_every_run_and_a_resume_keeps_it(small_workload, tmp_path):
    from click.testing import CliRunner

    from replay.cli import main

    out = tmp_path / "S"
    args = ["sweep", str(small_workload), "--policies", "swa-fixes", "--out", str(out), "--json",
            *[x for kv in SMALL for x in ("--set", kv)]]
    r = CliRunner().invoke(main, args + ["--model", "llama-3.1-8b"])
    assert r.exit_code == 0, r.output
    s = json.loads((out / "policy=swa-fixes" / "summary.json").read_text())
    assert s["kv_bytes"]["model"] == "llama-3.1-8b" and s["peak_full_used_gb"] == round(
        s["peak_full_used"] * 131072 / 1e9, 6)
    assert s["peak_swa_used_gb"] is None  # a dense preset has no SWA bytes
    import polars as pl

    assert pl.read_parquet(out / "summary.parquet")["peak_full_used_gb"][0] == s["peak_full_used_gb"]
    r = CliRunner().invoke(main, args + ["--model", "mellum-like-swa"])
    assert r.exit_code != 0 and "ran with --model llama-3.1-8b" in r.output
    r = CliRunner().invoke(main, ["sweep", str(small_workload), "--policies", "swa-fixes", "--out",
                                  str(tmp_path / "N"), "--model", "nope"])
    assert r.exit_code != 0 and "known: llama-3.1-8b" in r.output
