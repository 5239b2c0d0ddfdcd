"""README.md's Commands section lists every ``kvtrace`` command (and every subcommand), and its
Benchmarks table every benchmark script under ``bench/``."""

from __future__ import annotations

from pathlib import Path

import click

from replay.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _leaves(cmd: click.Command, path: list[str]):
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _leaves(sub, path + [name])
    else:
        yield path


def test_readme_lists_every_command():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Commands", 1)[1].split("```", 2)[1]
    lines = [line for line in block.splitlines() if line.startswith("kvtrace ")]
    missing = []
    for path in _leaves(main, []):
        head, rest = f"kvtrace {path[0]}", " ".join(path[1:])
        if not any(line.startswith(head + " ") or line == head for line in lines if rest in line):
            missing.append(" ".join(path))
    assert not missing, f"README.md Commands lacks: {missing}"


def test_readme_lists_every_benchmark():
    """Every script under ``bench/`` that runs as a program (``__main__``) has a row in the
    Benchmarks table; a helper module (``stall_probe.py``, ``fork_overhead.py``) need not."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    scripts = sorted(p.name for p in (ROOT / "bench").glob("*.py") if "__main__" in p.read_text())
    assert len(scripts) >= 10
    missing = [name for name in scripts if f"`bench/{name}" not in table]
    assert not missing, f"README.md Benchmarks lacks: {missing}"
