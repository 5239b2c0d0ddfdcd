"""Smoke tests for the memory benchmarks: tiny runs, output shape only (no timing asserts)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_host_free_json_has_the_contract_keys(capsys):
    mod = _load("host_free")
    assert mod.main(["--json", "--sizes", "4096,16384", "--iters", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("pool_sizes", "eager_free_ns", "lazy_free_ns", "eager_growth", "lazy_growth"):
        assert key in out
    assert out["pool_sizes"] == [4096, 16384]
    assert len(out["eager_free_ns"]) == len(out["lazy_free_ns"]) == 2
    assert out["eager_growth"] == out["eager_free_ns"][-1] / out["eager_free_ns"][0]


def test_host_free_table_prints(capsys):
    mod = _load("host_free")
    assert mod.main(["--sizes", "4096,8192", "--iters", "10"]) == 0
    text = capsys.readouterr().out
    assert "eager free" in text and "prepend free" in text


def test_tree_ops_runs_and_reports_medians(capsys):
    mod = _load("tree_ops")
    assert mod.main(["--json", "--num-cached", "40", "--iters", "30", "--warmup", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    for tree in ("full_only", "full_swa"):
        assert set(out[tree]) == {"match", "insert", "evict"}
        assert all(v["median_us"] > 0 for v in out[tree].values())
