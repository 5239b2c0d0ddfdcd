"""``--code`` runs and code A/B sweeps on the DeepSeek-V4 fork's two shared commits.

One sweep per module (fork processes take ~20-35 s to start): a small multi_turn workload under
SWA pressure, ``--code pre=<pre659>,post=<post659>,bad=<no such file>``, two jobs. Checked: each
code's run is a verifiable trace (``kvtrace verify``: 0 divergences), its manifest and summary
record the code (spec, sha, recognized target), the hive layout has the ``code=`` level, the
code that cannot be prepared fails alone, ``compare`` takes the first code as base, and the two
commits differ (#659's SWA-pressure chunk cap admits what pre659 leaves waiting). Bad specs and
settings a code cannot take are refused before any process starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fork.conftest import ROOT, fork_tarball, require_fork

SIZES = ("full_pool_tokens=8192", "swa_pool_tokens=1024", "chunked_prefill_size=1024", "max_running_requests=8")


def _workload(out: Path) -> Path:
    cmd = [sys.executable, "-m", "replay.cli", "workload", "generate", "--shape", "multi_turn", "--requests", "24",
           "--seed", "3", "--out", str(out), "--cold-start", "--set", "system_prompt_tokens_max=1024",
           "--set", "first_user_tokens_median=400", "--set", "output_tokens_median=40",
           "--set", "followup_user_tokens_median=100", "--set", "max_new_tokens=128"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    return out


pytestmark = pytest.mark.xdist_group("fork-code-replay")  # the module fixture runs once, on one worker

@pytest.fixture(scope="module")
def code_sweep(tmp_path_factory):
    require_fork()
    from replay.runs.sweep import sweep

    tmp = tmp_path_factory.mktemp("code-sweep")
    wl = _workload(tmp / "wl")
    codes = {"pre": str(fork_tarball("pre659")), "post": str(fork_tarball("post659")),
             "bad": str(tmp / "no-such-code.tar.xz")}
    df = sweep(wl, tmp / "R", policies=["recorded"], sets=SIZES, jobs=2, codes=codes)
    return {"wl": wl, "root": tmp / "R", "df": df}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_code_runs_verify_and_record_their_code(code_sweep):
    from replay.diagnosis.verify import verify
    from replay.runs import read_summary

    root = code_sweep["root"]
    for name, target in (("pre", "bytedance-dsv4-pre659"), ("post", "bytedance-dsv4-post659")):
        run = root / f"code={name}" / "policy=recorded"
        assert (run / "summary.json").is_file(), sorted(p.name for p in root.iterdir())
        rep = verify(run)
        assert rep.divergences == [] and rep.stats_rows_checked > 10, rep.divergences[:3]
        manifest = json.loads((run / "manifest.json").read_text())
        code = manifest["run"]["code"]
        assert code["name"] == name and code["target"] == target and code["fingerprint_known"]
        assert len(code["sha"]) == 16 and code["spec"].endswith(f"sglang-{name}659.tar.xz")
        assert manifest["run"]["backend"] == "fork" and manifest["server"]["sglang_version"] == target
        s = read_summary(run)
        assert s.code["target"] == target and s.code["pools"]["tree"] == "UnifiedRadixCache"
        assert s.requests == 24 and s.finished + s.aborted == 24 and s.steps > 100


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_failed_code_does_not_stop_the_others(code_sweep):
    df = code_sweep["df"]
    status = dict(zip(df["code"].to_list(), df["status"].to_list()))
    assert status == {"pre": "ok", "post": "ok", "bad": "failed"}, status
    err = df.filter(df["code"] == "bad")["error"][0]
    assert "code bad: cannot prepare" in err and "no-such-code.tar.xz" in err
    assert set(df["code_target"].drop_nulls().to_list()) == {"bytedance-dsv4-pre659", "bytedance-dsv4-post659"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compare_and_diff_read_the_code_axis(code_sweep):
    from replay.runs.compare import compare, format_table
    from replay.runs.diff import diff_runs

    root = code_sweep["root"]
    df = compare(root)
    assert df["code"].to_list() == ["pre", "post"] and set(df["base"].to_list()) == {"pre"}
    pre, post = df.row(0, named=True), df.row(1, named=True)
    assert pre["finished_delta"] == 0
    # #659's SWA-pressure chunk cap: a 1024-token chunk never fits a 1024-slot SWA pool next to
    # running requests at pre659 (left waiting, then unschedulable); post659 shrinks it and serves all
    assert post["finished"] == 24 and pre["finished"] < 24
    assert post["finished_delta"] == post["finished"] - pre["finished"]
    head = format_table(df, width=100).splitlines()[0]  # transposed: runs labelled "<code> <policy>"
    assert "pre recorded" in head and "post recorded" in head
    d = diff_runs(root / "code=pre" / "policy=recorded", root / "code=post" / "policy=recorded")
    assert d.first_step is not None and d.first_step > 1
    out = subprocess.run([sys.executable, "-m", "replay.cli", "compare", str(root), "--json"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["base"] == "pre"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sweep_resumes_without_rerunning_complete_codes(code_sweep):
    from replay.runs.sweep import sweep

    root = code_sweep["root"]
    before = (root / "code=pre" / "policy=recorded" / "summary.json").stat().st_mtime_ns
    codes = {"pre": str(fork_tarball("pre659")), "post": str(fork_tarball("post659"))}
    df = sweep(code_sweep["wl"], root, policies=["recorded"], sets=SIZES, jobs=2, codes=codes)
    assert df["status"].to_list() == ["ok", "ok"]
    assert (root / "code=pre" / "policy=recorded" / "summary.json").stat().st_mtime_ns == before
    from replay.runs.replay import RunError

    with pytest.raises(RunError, match="code 'pre' was"):
        sweep(code_sweep["wl"], root, policies=["recorded"], sets=SIZES, codes={"pre": codes["post"]})


@pytest.mark.timeout(120)
def test_bad_specs_and_settings_are_refused_naming_what_failed(tmp_path):
    require_fork()
    from replay.runs import replay_run
    from replay.runs.replay import RunError

    wl = ROOT / "data" / "workloads" / "multi_turn"
    post = str(fork_tarball("post659"))
    (tmp_path / "empty").mkdir()
    cases = [
        (dict(code=str(tmp_path / "nope.tar.xz")), "cannot prepare .*nope.tar.xz: no such file"),
        (dict(code=str(tmp_path / "empty")), "without python/sglang"),
        (dict(code="sglang==banana"), "cannot prepare sglang==banana: expected sglang==VERSION"),
        (dict(code=post, policy="baseline"), "policy 'baseline' on a code"),
        (dict(code=post, sets={"swa_admission": "shrink_always"}), "swa_admission cannot be set on a code"),
        (dict(code=post, sets={"tree_core": "rust"}), "tree_core cannot be expressed by the fork backend"),
        (dict(code=post, env=["NOT AN ENV"]), "--env 'NOT AN ENV': expected NAME=VALUE"),
    ]
    for kw, msg in cases:
        with pytest.raises(RunError, match=msg):
            replay_run(wl, tmp_path / "out", **kw)
        assert not (tmp_path / "out" / "manifest.json").exists()
    out = subprocess.run([sys.executable, "-m", "replay.cli", "replay", str(wl), "--code",
                          str(tmp_path / "nope.tar.xz"), "--out", str(tmp_path / "o2")], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "kvtrace: error: code nope: cannot prepare" in out.stderr
    assert "Traceback" not in out.stderr
