"""What ``kvtrace plan`` and ``kvtrace capacity`` share: the options of a grid of reference
replays (preset, model, output directory, parallelism, progress, restart, JSON) and the run
around the library call (``--force``, signals as interrupts, third-party logs to a file)."""

from __future__ import annotations

import json
from typing import Callable

import click

from replay.models import PRESETS


def grid_options(what: str, out_help: str, json_help: str) -> Callable:
    """A decorator adding the shared options, ``what`` naming one replay of the grid (``split``,
    ``size``); they follow the command's own options in its help."""
    opts = [
        click.option("--policy", default="recorded", show_default=True, help=f"Preset every {what} replays under."),
        click.option("--model", default=None, metavar="NAME",
                     help="Model preset giving the pools' bytes per token (needed when the trace records none): "
                          + ", ".join(PRESETS) + " (docs/capacity.md)."),
        click.option("--out", required=True, type=click.Path(file_okay=False), help=out_help),
        click.option("--jobs", type=click.IntRange(min=1), default=2, show_default=True, help="Replays at a time."),
        click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True),
        click.option("--quiet", is_flag=True, help="No progress bar."),
        click.option("--force", is_flag=True, help="Start over: remove --out first if it holds a kvtrace sweep."),
        click.option("--json", "as_json", is_flag=True, help=json_help),
    ]

    def add(f):
        for opt in reversed(opts):
            f = opt(f)
        return f

    return add


def run_grid(source: str, out: str, force: bool, call: Callable, as_json: bool, lines: Callable):
    """``call()`` under ``--force`` handling, signals as interrupts and third-party output sent
    to ``OUT/sglang.log``; prints ``lines(result)`` (or its JSON) and returns the result."""
    from replay.cli.text import force_out
    from replay.console import third_party_to_log
    from replay.record import signals_as_interrupts

    force_out(out, force, check=False, inputs=(source,))
    with signals_as_interrupts(), third_party_to_log(f"{out}/sglang.log", verbose=False):
        res = call()
    if as_json:
        click.echo(json.dumps(res.to_dict(), default=str))
    else:
        for line in lines(res):
            click.echo(line)
    return res
