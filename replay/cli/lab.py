"""``kvtrace lab``: thin wrapper over :func:`replay.analysis.lab.start_lab`."""

from __future__ import annotations

import json
import shlex

import click


@click.command("lab", context_settings={"ignore_unknown_options": True})
@click.argument("path", required=False)
@click.argument("lab_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--port", type=int, default=None, help="Port for JupyterLab (default: its own).")
@click.option("--no-browser", is_flag=True, help="Do not open a browser.")
@click.option("--dry-run", is_flag=True, help="Print the command and environment, start nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print one JSON object.")
def lab(path: str | None, lab_args: tuple, port: int | None, no_browser: bool, dry_run: bool, as_json: bool) -> None:
    """Start JupyterLab on the bundled notebooks with PATH (trace, run or sweep) as the notebooks'
    parameter (env KVTRACE_DATA; default: the bundled data). Arguments after `--` go to
    JupyterLab (e.g. `kvtrace lab TRACE -- --ServerApp.token=x`); as root `--allow-root` is added."""
    from replay.analysis.lab import lab_command, start_lab

    if path is not None and path.startswith("-"):  # `kvtrace lab -- --flag`: no PATH
        lab_args, path = (path, *lab_args), None
    argv, env = lab_command(path, port=port, no_browser=no_browser, lab_args=lab_args)
    if dry_run:
        if as_json:
            click.echo(json.dumps({"argv": argv, "env": env}))
        else:
            click.echo(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + (" " if env else "")
                       + shlex.join(argv))
        return
    raise SystemExit(start_lab(path, port=port, no_browser=no_browser, lab_args=lab_args))
