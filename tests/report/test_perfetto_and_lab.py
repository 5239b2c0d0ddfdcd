"""``kvtrace export perfetto`` structure and counts; ``kvtrace lab --dry-run``."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from replay.analysis.lab import ENV_VAR, NOTEBOOKS_DIR
from replay.cli import main
from tests.analysis.conftest import small_rows, write_trace


def test_perfetto_export_structure_and_counts(tmp_path):
    trace = write_trace(tmp_path / "t", small_rows())
    out = tmp_path / "tl.json"
    r = CliRunner().invoke(main, ["export", "perfetto", str(trace), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    assert all({"name", "ph", "pid"} <= set(e) for e in ev)
    timed = [e for e in ev if e["ph"] != "M"]
    assert [e["ts"] for e in timed] == sorted(e["ts"] for e in timed)
    kinds = {}
    for e in timed:
        kinds[(e["ph"], e["name"])] = kinds.get((e["ph"], e["name"]), 0) + 1
    # 5 stats rows, 2 steps (prefill), 2 evictions, 1 retraction; request 0: queued, 2 chunks, decode
    assert kinds == {("C", "full pool"): 3, ("C", "swa pool"): 2, ("X", "prefill"): 2 + 2,
                     ("i", "eviction"): 2, ("i", "retraction"): 1, ("X", "queued"): 1, ("X", "decode"): 1}
    full = [e["args"] for e in timed if e["name"] == "full pool"]
    assert full[0] == {"used": 32, "evictable": 0, "protected": 32, "held": 0}
    steps = [e for e in timed if e.get("cat") == "step"]
    assert [(s["args"]["forward_ct"], s["dur"]) for s in steps] == [(1, 10.0), (2, 20.0)]
    assert all(e["dur"] >= 0 for e in timed if e["ph"] == "X")
    assert json.loads(r.output)["counts"]["counter"] == 5


def test_perfetto_export_refuses_a_non_trace(tmp_path):
    r = CliRunner().invoke(main, ["export", "perfetto", str(tmp_path), "--out", str(tmp_path / "x.json")])
    assert r.exit_code != 0 and "manifest.json" in r.output and "Traceback" not in r.output


def test_lab_dry_run_names_notebooks_and_parameter(tmp_path):
    trace = write_trace(tmp_path / "t", small_rows())
    r = CliRunner().invoke(main, ["lab", str(trace), "--dry-run", "--no-browser", "--port", "8899", "--json"])
    assert r.exit_code == 0, r.output
    cmd = json.loads(r.output)
    assert cmd["env"] == {ENV_VAR: str(trace.resolve())}
    assert cmd["argv"][:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--notebook-dir={NOTEBOOKS_DIR}" in cmd["argv"] and "--no-browser" in cmd["argv"]
    assert "--port=8899" in cmd["argv"]
    # the module it runs exists in this environment
    assert subprocess.run([sys.executable, "-c", "import jupyterlab"]).returncode == 0
