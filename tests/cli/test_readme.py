"""README.md's Commands section lists every ``kvtrace`` command (and every subcommand)."""

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
