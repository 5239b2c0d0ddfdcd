"""An upstream sglang tree as a code (``--code DIR`` / ``sglang==X``): it runs on the real-code
backend in its own process (``replay.backends.sglang.code_run``). A copy of the installed
sglang 0.5.23 as a code tree gives the very run the installed one gives in-process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.runs.conftest import SMALL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group("fork-code-replay")]
SIZES = tuple(s for s in SMALL if not s.startswith("max_running"))  # (sizes only: no policy knob)


@pytest.fixture(scope="module")
def upstream_tree(tmp_path_factory):
    import importlib.util

    root = tmp_path_factory.mktemp("upstream") / "sglang-copy"
    shutil.copytree(Path(importlib.util.find_spec("sglang").origin).parent, root / "sglang",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return root


def test_a_copy_of_the_installed_release_replays_as_the_installed_one(upstream_tree, small_workload, tmp_path):
    from replay.diagnosis import verify
    from replay.runs import MEASURED, replay_run
    from replay.runs.code import resolve_code

    code = resolve_code(str(upstream_tree), "copy")
    assert code.backend == "sglang" and code.target == "sglang-0.5.23" and code.fingerprint_known
    there = replay_run(small_workload, tmp_path / "copy", code=f"copy={upstream_tree}", sets=list(SIZES))
    here = replay_run(small_workload, tmp_path / "here", sets=list(SIZES))
    a, b = there.to_dict(), here.to_dict()
    assert a["code"]["target"] == "sglang-0.5.23" and a["code"]["name"] == "copy" and not b["code"]
    for k in (*MEASURED, "run", "code", "env", "backend", "policy", "assumed", "patches", "settings"):
        a.pop(k, None), b.pop(k, None)
    assert a == b  # the same figures: same requests, steps, peaks, hits, TTFT
    manifest = json.loads((tmp_path / "copy" / "manifest.json").read_text())
    assert manifest["run"]["backend"] == "sglang" and manifest["run"]["code"]["spec"] == str(upstream_tree)
    rep = verify(tmp_path / "copy")
    assert rep.verdict == "ok" and rep.stats_rows_checked > 0, rep.totals
