"""``--grid env.NAME=v1,v2`` on ``sweep``: grid points that set an ``SGLANG_*``/``KVTRACE_*``
switch of a code's process, each a hive level ``env.NAME=<v>`` below ``policy=``. Checked here
without starting a code's process: the plan's layout and the environment each point gets, and
the refusals (a name that is no such switch, a value that cannot name a directory, a value given
twice, the switch asked of the installed sglang, which runs in-process), all before any run. The
switch reaching a fork process is checked in tests/fork/test_code_sweep_report.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from replay.cli import main
from replay.runs.replay import RunError
from replay.runs.sweep import parse_grid, plan

NAME = "SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER"


def test_env_points_are_hive_levels_and_reach_only_the_environment():
    grid = parse_grid([f"env.{NAME}=1,2", "full_pool_tokens=8192,16384", "env.KVTRACE_FORK_MODEL=swa"])
    assert grid == [(f"env.{NAME}", ["1", "2"]), ("full_pool_tokens", [8192, 16384]),
                    ("env.KVTRACE_FORK_MODEL", ["swa"])]
    specs = plan(["recorded"], grid, {"pre": "A.tar.xz", "post": "B.tar.xz"})
    assert len(specs) == 2 * 2 * 2
    first, last = specs[0], specs[-1]
    assert first.key == f"code=pre/policy=recorded/env.{NAME}=1/full_pool_tokens=8192/env.KVTRACE_FORK_MODEL=swa"
    assert last.key == f"code=post/policy=recorded/env.{NAME}=2/full_pool_tokens=16384/env.KVTRACE_FORK_MODEL=swa"
    assert last.env_grid == {NAME: "2", "KVTRACE_FORK_MODEL": "swa"}
    assert last.knob_grid == {"full_pool_tokens": 16384}  # env points are no knob
    assert len({s.key for s in specs}) == len(specs)


@pytest.mark.parametrize("item, message", [
    ("env.PATH=/usr/bin", "NAME must be an SGLANG_\\* or KVTRACE_\\* variable .*got 'PATH'"),
    ("env.LD_PRELOAD=x.so", "got 'LD_PRELOAD'"),
    ("env.sglang_lower=1", "got 'sglang_lower'"),
    ("env.SGLANG_=1", "got 'SGLANG_'"),
    (f"env.{NAME}=1/2", "the value '1/2' cannot name the run's directory"),
    (f"env.{NAME}=a b", "the value 'a b' cannot name"),
    (f"env.{NAME}=..", "the value '..' cannot name"),
    (f"env.{NAME}=1,2,1", "the value '1' is given twice"),
    (f"env.{NAME}=,", "expected env.SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER=v1,v2"),
])
def test_bad_env_points_are_refused_naming_them(item, message):
    with pytest.raises(RunError, match=message):
        parse_grid([item])


def test_env_points_given_twice_are_refused():
    with pytest.raises(RunError, match=f"--grid env.{NAME} given twice"):
        parse_grid([f"env.{NAME}=1", f"env.{NAME}=2"])


def test_the_cli_refuses_a_bad_switch_before_any_run(small_workload, tmp_path):
    out = tmp_path / "R"
    r = CliRunner().invoke(main, ["sweep", str(small_workload), "--code", "post=nowhere.tar.xz", "--grid",
                                  "env.HOME=/tmp", "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "kvtrace: error: --grid env.HOME:" in r.output and "SGLANG_* or KVTRACE_*" in r.output
    assert "Traceback" not in r.output
    assert not (out / "sweep.json").exists()


@pytest.mark.parametrize("codes", [None, {"base": "installed"}], ids=["no-code", "installed"])
def test_switches_of_the_installed_sglang_are_refused(small_workload, tmp_path, codes):
    from replay.runs.sweep import sweep

    with pytest.raises(RunError, match="environment switches apply to a code's own process; "
                                       "(the installed sglang|base) runs in this process"):
        sweep(small_workload, tmp_path / "R", policies=["recorded"], grid=[f"env.{NAME}=1,2"], codes=codes)
    assert not (tmp_path / "R" / "sweep.json").exists()
