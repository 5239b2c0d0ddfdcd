"""``kvtrace record --code`` and ``kvtrace doctor --replay --code`` on the fork's post659 commit.

Three fork processes in all (each takes ~20-35 s to start): one ``record --code`` of a small
multi_turn workload under SWA pressure (8 requests) with an ``--env`` switch, then one
``doctor --replay --code`` of that trace (its recorded and its recommended re-run). Checked: the
recorded trace verifies (0 divergences) and its manifest and ``backend.json`` record the code
(spec, sha, recognized target), the environment and the settings that reached it; the doctor's
re-runs are on the code, carry the recorded switch, and apply the recommended policy knob as the
code's own switch (``swa_out_of_window_release=decode_and_unfinished_insert`` is post659's
``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS=1``), under which the trace's cause is gone.
What a code cannot take is refused before any process starts, naming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.fork.conftest import ROOT, fork_tarball, require_fork

SIZES = ("full_pool_tokens=8192", "swa_pool_tokens=1024", "chunked_prefill_size=1024", "max_running_requests=8")
SWITCH = "SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS"

pytestmark = pytest.mark.xdist_group("fork-code-replay")  # the fork's code runs, one worker


def _kvtrace(*args, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "replay.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                         text=True)
    if check:
        assert out.returncode == 0, out.stderr[-3000:]
    return out


def _workload(out: Path) -> Path:
    _kvtrace("workload", "generate", "--shape", "multi_turn", "--requests", "8", "--seed", "3", "--out", out,
             "--cold-start", "--set", "system_prompt_tokens_max=1024", "--set", "first_user_tokens_median=400",
             "--set", "output_tokens_median=40", "--set", "followup_user_tokens_median=100",
             "--set", "max_new_tokens=128")
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """``kvtrace record --code post=<post659> --env ...`` of 8 requests (one fork process)."""
    require_fork()
    tmp = tmp_path_factory.mktemp("code-record")
    wl = _workload(tmp / "wl")
    sets = [a for s in SIZES for a in ("--set", s)]
    out = _kvtrace("record", "--workload", wl, "--code", f"post={fork_tarball('post659')}", *sets,
                   "--env", "SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER=2", "--out", tmp / "T", "--json")
    return {"wl": wl, "trace": tmp / "T", "summary": json.loads(out.stdout), "tmp": tmp}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_record_on_a_code_writes_a_verifiable_trace_that_names_it(recorded):
    from replay.diagnosis.verify import verify

    trace, summary = recorded["trace"], recorded["summary"]
    rep = verify(trace)
    assert rep.divergences == [] and rep.stats_rows_checked > 10, rep.divergences[:3]
    manifest = json.loads((trace / "manifest.json").read_text())
    run = manifest["run"]
    assert run["command"] == "record" and run["backend"] == "fork"
    code = run["code"]
    assert code["name"] == "post" and code["target"] == "bytedance-dsv4-post659" and code["fingerprint_known"]
    assert len(code["sha"]) == 16 and code["spec"].endswith("sglang-post659.tar.xz")
    assert run["env"] == {"SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER": "2"}
    assert manifest["env"]["SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER"] == "2"  # what the code's process ran with
    assert run["settings"]["full_pool_tokens"] == 8192 and run["settings"]["swa_pool_tokens"] == 1024
    assert not set(run["settings"]) & {"swa_admission", "swa_out_of_window_release", "tree_core"}
    assert manifest["server"]["sglang_version"] == "bytedance-dsv4-post659"
    backend = json.loads((trace / "backend.json").read_text())
    assert backend == {k: v for k, v in summary.items() if k != "log"}  # --json prints backend.json
    assert backend["backend"] == "fork" and backend["code"]["pools"]["tree"] == "UnifiedRadixCache"
    assert backend["result"]["num_requests"] == 8 and backend["result"]["num_finished"] == 8
    assert backend["env"] == run["env"] and backend["end_state"] == "complete"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_doctor_replay_on_the_code_applies_the_codes_own_switch(recorded):
    trace = recorded["trace"]
    out = _kvtrace("doctor", trace, "--replay", "--code", f"post={fork_tarball('post659')}", "--json", check=False)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    rep = json.loads(out.stdout)
    assert rep["primary_cause"] == "unfinished_insert_without_release", rep["causes"]
    assert rep["fix_sets"] == ["swa_out_of_window_release=decode_and_unfinished_insert"]
    r = rep["replay"]
    assert r["code"]["target"] == "bytedance-dsv4-post659" and r["code"]["name"] == "post"
    # the recorded switch is carried; the recommended policy knob becomes the code's own switch
    assert r["recorded_env"] == {"SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER": "2"}
    assert r["recommended_env"] == {SWITCH: "1"} and r["recommended_sets"] == [] and r["not_applied"] == []
    assert all(s.partition("=")[0] not in ("swa_admission", "tree_core") for s in r["recorded_sets"])
    runs = r["runs"]
    assert set(runs) == {"recorded", "recommended"}
    assert "unfinished_insert_without_release" in runs["recorded"]["causes"]
    assert "unfinished_insert_without_release" not in runs["recommended"]["causes"]
    assert runs["recorded"]["identity_violations"] == 0 == runs["recommended"]["identity_violations"]
    assert r["growth_disappears"] is True and r["growth_disappears_on_code"] is False
    assert r["summary"].startswith("on code post (bytedance-dsv4-post659): the trace stable")
    assert f"recommended {SWITCH}=1: stable; the problem disappears" in r["summary"]


@pytest.mark.timeout(180)
def test_what_a_code_cannot_take_is_refused_before_any_process(tmp_path):
    require_fork()
    from replay.cli import main as cli

    wl = ROOT / "data" / "workloads" / "multi_turn"
    post = str(fork_tarball("post659"))
    trace = ROOT / "data" / "incidents" / "lost_unlock"
    cases = [
        (["record", "--workload", wl, "--code", post, "--set", "swa_admission=shrink_always"],
         "swa_admission cannot be set on a code: a commit is its own behaviour"),
        (["record", "--workload", wl, "--code", post, "--set", "tree_core=rust"],
         "tree_core cannot be expressed by the fork backend"),
        (["record", "--workload", wl, "--env", "SGLANG_X=1"], "--env applies to a code's own process"),
        (["record", "--workload", wl, "--code", post, "--incident", "lost_free"],
         "--incident lost_free with --code post659: bugs are planted in the installed sglang's classes"),
        (["record", "--workload", wl, "--code", post, "--backend", "reference"],
         "--backend reference with --code post659: a code runs on its target's own backend"),
        (["record", "--workload", wl, "--code", f"a={post},b={post}"], "one code per run"),
        (["record", "--workload", wl, "--code", str(tmp_path / "nope.tar.xz")],
         "code nope: cannot prepare .*nope.tar.xz: no such file"),
        (["doctor", trace, "--code", post], "--code/--env apply to the re-runs of --replay; add --replay"),
        (["doctor", trace, "--replay", "--code", str(tmp_path / "nope.tar.xz")], "code nope: cannot prepare"),
        (["doctor", trace, "--replay", "--env", "SGLANG_X=1"], "--env applies to a code's own process"),
    ]
    import re

    for args, msg in cases:
        res = CliRunner().invoke(cli, [str(a) for a in args] + (["--out", str(tmp_path / "T")]
                                                                if args[0] == "record" else []))
        assert res.exit_code == 2, (args, res.output)
        assert re.search(msg, res.output), (args, res.output)
        assert "Traceback" not in res.output
        assert not (tmp_path / "T" / "manifest.json").exists()


def test_a_commit_without_the_switch_leaves_the_knob_out_naming_why():
    """pre659 has no ``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS``: the recommended knob is
    not applied there (files only; no process)."""
    require_fork()
    from replay.diagnosis.rerun import on_code
    from replay.runs.code import resolve_code

    fix = ["swa_out_of_window_release=decode_and_unfinished_insert"]
    sets = ["full_pool_tokens=8192", "swa_admission=shrink_always", "swa_lru_refresh=window_aware",
            "tree_core=python"]  # swa_lru_refresh at its default: left out silently
    pre, post = (resolve_code(str(fork_tarball(c)), c) for c in ("pre659", "post659"))
    kept, fix_kept, switches, not_applied = on_code(pre, sets, fix, {"name": "lost_free", "every": 7})
    assert kept == ["full_pool_tokens=8192"] and fix_kept == [] and switches == {}
    whys = {n.get("recorded") or n.get("recommended") or n.get("incident"): n["why"] for n in not_applied}
    assert whys[fix[0]].endswith("a commit is its own behaviour (no patch); pre659 defines no switch for it")
    assert set(whys) == {fix[0], "swa_admission=shrink_always", "tree_core=python", "lost_free"}
    assert whys["tree_core=python"] == "the fork's tree is pure Python (no Rust core)"
    assert on_code(post, [], fix, {})[2] == {SWITCH: "1"}
