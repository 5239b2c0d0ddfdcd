"""``kvtrace launch`` and ``kvtrace hooks``: thin wrappers over :mod:`replay.launch` and
:mod:`tracer.sglang.activation.autoload`."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import click

from replay.errors import KvtraceError
from replay.launch import finish_manifest, launch_env, run_forwarding, write_launch_manifest
from replay.outdir import replace_dir


def _check_command(cmd: list[str]) -> None:
    """Refuse a server command that cannot be run, before anything is created."""
    prog = cmd[0]
    if os.sep in prog or (os.altsep and os.altsep in prog):
        p = Path(prog)
        if p.is_dir():
            raise KvtraceError(f"COMMAND {prog}: is a directory; expected the server program "
                               "(e.g. python -m sglang.launch_server ...)")
        if not p.exists():
            raise KvtraceError(f"COMMAND {prog}: no such file; expected the server program")
        if not os.access(p, os.X_OK):
            raise KvtraceError(f"COMMAND {prog}: not executable; expected the server program")
    elif shutil.which(prog) is None:
        if Path(prog).is_dir():
            raise KvtraceError(f"COMMAND {prog}: is a directory; expected the server program")
        raise KvtraceError(f"COMMAND {prog}: not found on PATH; expected the server program")


@click.command(
    "launch",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Trace directory to create (each server process writes its own rank).")
@click.option("--detail", type=click.Choice(["steps", "counts", "pages"]), default="counts", show_default=True,
              help="Capture level: steps (request, step and stats rows; cheapest), counts (every pool and cache op), pages (counts plus page ids; a device sync per op).")
@click.option("--flush-ms", type=int, default=1000, show_default=True,
              help="Flush interval of each recorder (bounds what a crash can lose).")
@click.option("--hash-block-tokens", type=int, default=16, show_default=True,
              help="Tokens per prompt page hash in the request family (0: no hashes).")
@click.option("--force", is_flag=True, help="Replace --out if it already holds a trace.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def launch(out: Path, detail: str, flush_ms: int, hash_block_tokens: int, force: bool,
           command: tuple[str, ...]) -> None:
    """Run a server COMMAND with the kvtrace sglang hooks on, recording into --out.

    \b
    kvtrace launch --out /traces/run1 -- python -m sglang.launch_server \\
        --model-path M --page-size 64 --swa-full-tokens-ratio 0.1

    Every Python process of the server that builds real KV pools (the scheduler of each TP/DP
    rank) records its own rank partition. Signals are forwarded; the exit code is the server's.
    """
    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise click.UsageError("missing the server command after --")
    _check_command(cmd)
    replace_dir(out, "--out", force)  # --force replaces only a kvtrace trace, never other files
    out = out.resolve()
    from tracer.sglang.activation import autoload

    write_launch_manifest(out, cmd, detail=detail, flush_ms=flush_ms,
                          hash_block_tokens=hash_block_tokens)
    shim_dir = Path(tempfile.mkdtemp(prefix="kvtrace-launch-"))
    try:
        autoload.write_launch_shim(shim_dir)
        env = launch_env(out, shim_dir, detail=detail, flush_ms=flush_ms,
                         hash_block_tokens=hash_block_tokens)
        try:
            rc = run_forwarding(cmd, env)
        except OSError as e:  # not found, a directory, not executable, ...
            raise KvtraceError(f"COMMAND {cmd[0]}: cannot run it ({e.strerror or e}); expected the "
                               "server program") from None
    finally:
        shutil.rmtree(shim_dir, ignore_errors=True)
    finish_manifest(out, rc)
    ranks = sorted(p.name for p in (out / "ranks").glob("rank=*.json")) if (out / "ranks").is_dir() else []
    click.echo(f"kvtrace launch: server exited with {rc}; {len(ranks)} recording process(es) "
               f"in {out}", err=True)
    sys.exit(rc)


@click.group("hooks")
def hooks() -> None:
    """Manage the sglang hook autoload (.pth) of this Python environment."""


@hooks.command("install-pth")
@click.option("--site-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory to write kvtrace_autoload.pth into (default: this site-packages).")
def install_pth_cmd(site_dir: Path | None) -> None:
    """Install the autoload: any process of this environment with KVTRACE_DIR set records.

    Without KVTRACE_DIR the .pth costs one environment lookup at interpreter start-up.
    """
    from tracer.sglang.activation import autoload

    if site_dir is not None and not site_dir.is_dir():
        raise KvtraceError(f"--site-dir {site_dir}: no such directory; expected an existing "
                           "site-packages directory of the Python environment to arm")
    p = autoload.install_pth(site_dir)
    click.echo(f"installed {p}")


@hooks.command("uninstall-pth")
@click.option("--site-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def uninstall_pth_cmd(site_dir: Path | None) -> None:
    """Remove the autoload .pth file."""
    from tracer.sglang.activation import autoload

    click.echo("removed" if autoload.uninstall_pth(site_dir) else "not installed")


@hooks.command("status")
@click.option("--site-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status_cmd(site_dir: Path | None, as_json: bool) -> None:
    """Show whether the .pth is installed and current, and the supported sglang versions."""
    from tracer.sglang import hooks as sg_hooks
    from tracer.sglang.activation import autoload

    st = autoload.pth_status(site_dir)
    st["supported_sglang"] = list(sg_hooks.SUPPORTED_SGLANG_VERSIONS)
    st["kvtrace_dir"] = os.environ.get("KVTRACE_DIR")
    if as_json:
        click.echo(json.dumps(st))
    else:
        for k, v in st.items():
            click.echo(f"{k}: {v}")
