"""An unmatched code base under ``kvtrace launch``: one stderr line, nothing recorded, the trace
``uncovered``, a non-zero exit; ``--partial``; ``inspect --strict``; ``hooks check --json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KVTRACE = [sys.executable, "-m", "replay.cli"]

# A code base that is no target: it has a watched module (so the autoload wakes up) with a
# ReqToTokenPool of other names.
FAKE = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/mem_cache/__init__.py": "",
    "sglang/srt/mem_cache/memory_pool.py": (
        "class ReqToTokenPool:\n"
        "    def take(self, reqs):\n"
        "        return None\n"),
}
SERVER = "import sglang.srt.mem_cache.memory_pool as m\nm.ReqToTokenPool().take([])\nprint('served')\n"


def _fake(tmp_path: Path) -> tuple[Path, Path]:
    code = tmp_path / "code"
    for rel, text in FAKE.items():
        f = code / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    return code, server


def _run(args, code: Path, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTRACE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(code), str(ROOT)])
    return subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240, **kw)


def test_unmatched_code_is_uncovered_loudly_and_launch_fails(tmp_path):
    code, server = _fake(tmp_path)
    out = tmp_path / "trace"
    r = _run(KVTRACE + ["launch", "--out", str(out), "--", sys.executable, str(server)], code)
    assert "served" in r.stdout  # the server ran normally
    assert r.returncode == 3, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("kvtrace: NOT RECORDING")]
    assert len(lines) == 1 and "no known target" in lines[0], r.stderr[-2000:]
    m = json.loads((out / "manifest.json").read_text())
    assert [u["reason"] for u in m["uncovered"]] and m.get("ranks") == []
    assert m["uncovered"][0]["target"] is None
    insp = _run(KVTRACE + ["inspect", "--json", str(out)], code)
    s = json.loads(insp.stdout)
    assert s["state"] == "uncovered" and s["uncovered"]
    text = _run(KVTRACE + ["inspect", str(out)], code).stdout
    assert "uncovered" in text and "no known target" in text
    strict = _run(KVTRACE + ["inspect", "--strict", str(out)], code)
    assert strict.returncode != 0 and "uncovered" in strict.stderr


def test_partial_records_what_matches_and_is_never_complete(tmp_path):
    code, server = _fake(tmp_path)
    out = tmp_path / "trace"
    r = _run(KVTRACE + ["launch", "--partial", "--out", str(out), "--", sys.executable,
                        str(server)], code)
    assert "NOT RECORDING" not in r.stderr
    s = json.loads(_run(KVTRACE + ["inspect", "--json", str(out)], code).stdout)
    # nothing of this code matched a hook, so even --partial records nothing: never complete
    assert s["state"] == "uncovered" and r.returncode == 3


def test_hooks_check_json_on_unmatched_code(tmp_path):
    code, _ = _fake(tmp_path)
    r = _run(KVTRACE + ["hooks", "check", "--json"], code)
    cov = json.loads(r.stdout)
    assert r.returncode == 1 and cov["target"] is None and cov["state"] == "none"
    assert cov["sglang_root"] == str((code / "sglang").resolve())
    assert cov["hooks"]["pool.req_to_token"]["state"] in ("absent", "mismatch")
    assert cov["pools"]["req_to_token"]["accounted"] is False


@pytest.mark.sglang
@pytest.mark.timeout(600)
def test_hooks_check_json_on_the_installed_0_5_23():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTRACE_")}
    r = subprocess.run(KVTRACE + ["hooks", "check", "--json"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    cov = json.loads(r.stdout)
    assert r.returncode == 0, r.stderr[-2000:]
    assert cov["target"] == "sglang-0.5.23" and cov["state"] == "full"
    assert {h["state"] for h in cov["hooks"].values()} == {"installed"}
    text = subprocess.run(KVTRACE + ["hooks", "check", "--detail", "steps"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600).stdout
    assert "sglang-0.5.23" in text and "skipped" in text and "pool.device" in text
