"""One error convention for every command (refused input: ``kvtrace: error: ...``, exit 2), hints
that name only options that exist, "did you mean" for typos, --force on every command that
writes an output directory."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from replay.cli import main

ROOT = Path(__file__).resolve().parents[2]
WL = ROOT / "data" / "workloads" / "multi_turn"
INC = ROOT / "data" / "incidents" / "healthy_chat"


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _command(path: list[str]) -> click.Command:
    cmd = main
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _options(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params for o in getattr(p, "opts", [])} | {"--debug", "--help"}


def _refusals(tmp: Path):
    """(command path, argv, expected fragment) of refused inputs across the commands."""
    kv = tmp / "kv"
    shutil.copytree(INC, kv)
    return [
        (["verify"], ["verify", WL], "no `stats` rows"),
        (["doctor"], ["doctor", WL], "no `stats` rows"),
        (["record"], ["record", "--workload", WL, "--out", kv, "--backend", "reference"], "--force"),
        (["replay"], ["replay", WL, "--out", kv, "--backend", "reference"], "--force"),
        (["replay"], ["replay", WL, "--out", tmp / "r", "--policy", "swa-fix"], "did you mean 'swa-fixes'"),
        (["replay"], ["replay", WL, "--out", tmp / "r", "--set", "page_sise=16"], "did you mean 'page_size'"),
        (["sweep"], ["sweep", WL, "--out", tmp / "s", "--policies", "basline"], "did you mean 'baseline'"),
        (["compact"], ["compact", INC, "--out", kv], "--force"),
        (["workload", "generate"], ["workload", "generate", "--shape", "multiturn", "--out", tmp / "w"],
         "did you mean 'multi_turn'"),
        (["workload", "generate"], ["workload", "generate", "--shape", "agentic", "--set", "mean_step=2",
                                    "--out", tmp / "w"], "has no parameter 'mean_step'"),
        (["workload", "generate"], ["workload", "generate", "--shape", "multi_turn", "--out", kv], "--force"),
        (["workload", "stats"], ["workload", "stats", tmp / "nothing"], "not a directory"),
        (["compare"], ["compare", tmp], ""),
        (["verify"], ["verify", "--jsn", INC], "Did you mean '--json'"),
        ([], ["verfy", INC], "Did you mean 'verify'"),
    ]


def test_refused_input_is_one_line_exit_2_and_hints_name_real_options(tmp_path):
    for path, argv, fragment in _refusals(tmp_path):
        res = _cli(*argv)
        assert res.exit_code == 2, (argv, res.exit_code, res.output)
        last = res.output.strip().splitlines()[-1]
        assert last.startswith("kvtrace: error: "), (argv, res.output)
        assert fragment in last, (argv, last)
        assert "Traceback" not in res.output and "Error: " not in res.output.replace("kvtrace: error: ", "")
        if path and "No such option" not in last:  # every --option a hint names is an option of that command
            hint = re.sub(r"kvtrace [a-z-]+(?: [A-Z_]+)? --[a-z-]+", "", last.split(";", 1)[-1])  # another command's
            named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", hint))
            assert named <= _options(_command(path)), (argv, named - _options(_command(path)))
    assert (tmp_path / "kv" / "manifest.json").is_file()  # nothing was replaced


WRITERS = [["record"], ["replay"], ["sweep"], ["compact"], ["launch"], ["workload", "generate"],
           ["workload", "from-trace"], ["workload", "import", "mooncake"], ["workload", "import", "bailian"]]


@pytest.mark.parametrize("path", WRITERS, ids=" ".join)
def test_every_output_directory_writer_takes_force(path):
    assert "--force" in _options(_command(path))


def test_force_replaces_only_kvtrace_directories(tmp_path):
    kv = tmp_path / "kv"
    shutil.copytree(INC, kv)
    res = _cli("record", "--workload", WL, "--out", kv, "--backend", "reference", "--force",
               "--set", "full_pool_tokens=65536")
    assert res.exit_code == 0, res.output
    assert (kv / "backend.json").is_file() and "recorded" in res.output
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    res = _cli("record", "--workload", WL, "--out", other, "--backend", "reference", "--force")
    assert res.exit_code == 2 and "not a kvtrace trace or workload" in res.output
    assert (other / "notes.txt").read_text() == "mine"
    # --force never deletes the input: --out equal to (or above) the workload or trace is refused
    for argv in (["record", "--workload", kv, "--out", kv, "--backend", "reference", "--force"],
                 ["replay", kv, "--out", tmp_path, "--backend", "reference", "--force"],
                 ["sweep", kv, "--policies", "baseline", "--out", kv, "--force"],
                 ["compact", kv, "--out", kv, "--force"]):
        res = _cli(*argv)
        assert res.exit_code == 2 and "is or holds the input" in res.output, (argv, res.output)
        assert (kv / "manifest.json").is_file()
