"""``kvtrace lab``: thin wrapper over :func:`replay.analysis.lab.start_lab`."""

from __future__ import annotations

import json
import shlex

import click


@click.command("lab")
@click.argument("path", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--port", type=int, default=None, help="Port for JupyterLab (default: its own).")
@click.option("--no-browser", is_flag=True, help="Do not open a browser.")
@click.option("--dry-run", is_flag=True, help="Print the command and environment, start nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print one JSON object.")
def lab(path: str | None, port: int | None, no_browser: bool, dry_run: bool, as_json: bool) -> None:
    """Start JupyterLab on notebooks/ with PATH (trace, run or sweep) as the notebooks' parameter
    (env KVTRACE_DATA; default: the bundled data)."""
    from replay.analysis.lab import lab_command, start_lab

    try:
        argv, env = lab_command(path, port=port, no_browser=no_browser)
    except FileNotFoundError as e:
        raise click.ClickException(str(e)) from None
    if dry_run:
        if as_json:
            click.echo(json.dumps({"argv": argv, "env": env}))
        else:
            click.echo(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + (" " if env else "")
                       + shlex.join(argv))
        return
    raise SystemExit(start_lab(path, port=port, no_browser=no_browser))
