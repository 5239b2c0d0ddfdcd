"""The ``kvtrace`` entry point: help on every command, inspect/recover JSON, clear errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracer
from replay.cli import main as cli
from tracer.schema import Pool, PoolOp


def _walk(group, prefix=()):
    import click

    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _walk(cmd, prefix + (name,))


def test_every_command_has_help():
    r = CliRunner()
    for path, cmd in _walk(cli):
        res = r.invoke(cli, [*path, "--help"])
        assert res.exit_code == 0, (path, res.output)
        assert (cmd.help or "").strip(), f"kvtrace {' '.join(path)} has no help text"


def test_inspect_json_keys(tmp_path):
    tracer.start(tmp_path / "t", server={"page_size": 64})
    for i in range(100):
        tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 64, 1)
    tracer.stop()
    res = CliRunner().invoke(cli, ["inspect", str(tmp_path / "t"), "--json"])
    out = json.loads(res.output)
    assert {"schema_version", "families", "ranks", "span_ns", "drops", "bytes", "bytes_per_event"} <= set(out)
    assert out["families"]["pool"] == 100 and out["ranks"] == [0] and out["drops"] == 0
    assert out["bytes_per_event"] == round(out["bytes"] / 100, 3)


def test_inspect_not_a_trace_is_a_clear_error(tmp_path):
    res = CliRunner().invoke(cli, ["inspect", str(tmp_path)])
    assert res.exit_code == 2
    assert f"kvtrace: error: {tmp_path}/manifest.json: missing; expected a kvtrace trace directory" in res.output


def test_inspect_strict_fails_on_problems(tmp_path):
    tracer.start(tmp_path / "t")
    tracer.pool(Pool.FULL, PoolOp.ALLOC, 1, 1)
    tracer.stop()
    f = next((tmp_path / "t" / "pool").rglob("*.parquet"))
    f.write_bytes(b"junk")
    res = CliRunner().invoke(cli, ["inspect", str(tmp_path / "t"), "--strict"])
    assert res.exit_code == 1
    assert "unreadable Parquet" in res.output


def test_installed_entry_point_runs():
    exe = shutil.which("kvtrace") or str(Path(sys.executable).with_name("kvtrace"))
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in ("inspect", "recover"):
        assert name in out.stdout


@pytest.mark.sglang
def test_demo_runs_end_to_end_on_a_small_workload(tmp_path, capsys):
    from replay import demo

    w = tmp_path / "w"
    res = CliRunner().invoke(cli, ["workload", "generate", "--shape", "multi_turn", "--requests", "20",
                                   "--seed", "3", "--out", str(w)])
    assert res.exit_code == 0, res.output
    assert demo.main(["--workload", str(w), "--out", str(tmp_path / "t")]) == 0
    assert "demo check ok" in capsys.readouterr().out
