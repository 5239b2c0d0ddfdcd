"""The ``kvtrace`` command line: one entry point, subcommands registered from their modules."""

from __future__ import annotations

import importlib

import click

# (module, attribute) of each click command/group added to ``kvtrace``. Each owner adds its line.
_SUBCOMMANDS: list[tuple[str, str]] = [
    ("replay.cli.inspect", "inspect"),
    ("replay.cli.recover", "recover_cmd"),
    ("replay.cli.workload", "workload"),
    ("replay.cli.record", "record"),
    ("replay.cli.launch", "launch"),
    ("replay.cli.launch", "hooks"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kvtrace")
def main() -> None:
    """kvtrace: record, replay and analyze KV-cache memory of SGLang-family servers."""


for _mod, _attr in _SUBCOMMANDS:
    main.add_command(getattr(importlib.import_module(_mod), _attr))


if __name__ == "__main__":
    main()
