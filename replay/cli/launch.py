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
@click.option("--partial", is_flag=True,
              help="On code that is no known target or not fully covered, record what the "
                   "matching hooks cover (trace state partial) instead of nothing (uncovered).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def launch(out: Path, detail: str, flush_ms: int, hash_block_tokens: int, force: bool,
           partial: bool, command: tuple[str, ...]) -> None:
    """Run a server COMMAND with the kvtrace sglang hooks on, recording into --out.

    \b
    kvtrace launch --out /traces/run1 -- python -m sglang.launch_server \\
        --model-path M --page-size 64 --swa-full-tokens-ratio 0.1

    Every Python process of the server that builds real KV pools (the scheduler of each TP/DP
    rank) records its own rank partition. Signals are forwarded; the exit code is the server's,
    or 3 when it exited 0 but the trace is uncovered (no known target or hooks: nothing recorded;
    each server process said so on stderr; see `kvtrace hooks check`, and --partial).
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
        env.pop("KVTRACE_PARTIAL", None)
        if partial:
            env["KVTRACE_PARTIAL"] = "1"
        try:
            rc = run_forwarding(cmd, env)
        except OSError as e:  # not found, a directory, not executable, ...
            raise KvtraceError(f"COMMAND {cmd[0]}: cannot run it ({e.strerror or e}); expected the "
                               "server program") from None
    finally:
        shutil.rmtree(shim_dir, ignore_errors=True)
    finish_manifest(out, rc)
    ranks = sorted(p.name for p in (out / "ranks").glob("rank=*.json")) if (out / "ranks").is_dir() else []
    state = _trace_state(out)
    click.echo(f"kvtrace launch: server exited with {rc}; {len(ranks)} recording process(es) "
               f"in {out}; trace state {state}", err=True)
    if state == "uncovered" and rc == 0:
        click.echo("kvtrace launch: the trace is uncovered (nothing recorded: no known target "
                   "or hook coverage; `kvtrace inspect " + str(out) + "` lists why, `kvtrace "
                   "hooks check` each hook); exiting 3", err=True)
        sys.exit(UNCOVERED_EXIT)
    sys.exit(rc)


UNCOVERED_EXIT = 3  # the server exited 0 but the trace is uncovered


def _trace_state(out: Path) -> str:
    """The trace's state after the server ended (``replay.inspection``), ``unknown`` if it
    cannot be read."""
    try:
        from replay.inspection import summarize

        return summarize(out)["state"]
    except Exception:  # noqa: BLE001 (the exit code and the message matter, not the reason)
        return "unknown"


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
    from tracer.sglang.targets import TARGETS

    st["targets"] = [t.name for t in TARGETS]
    st["kvtrace_dir"] = os.environ.get("KVTRACE_DIR")
    if as_json:
        click.echo(json.dumps(st))
    else:
        for k, v in st.items():
            click.echo(f"{k}: {v}")


@hooks.command("check")
@click.option("--detail", type=click.Choice(["steps", "counts", "pages"]), default="counts",
              show_default=True, help="Capture level to check the hooks at.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def check_cmd(detail: str, as_json: bool) -> None:
    """Show the sglang target this environment imports and each hook's state, without starting
    a server (exit 1 unless the coverage is full)."""
    from tracer.sglang import hooks as sg_hooks
    from replay.inspection import coverage_lines

    try:  # CPU-only environments: triton/torchvision import stubs, only where they are absent
        from replay.backends.sglang.env import install_import_stubs

        install_import_stubs()
    except Exception:  # noqa: BLE001 (then the imports themselves say what is missing)
        pass
    cov = sg_hooks.coverage_here(detail)
    if as_json:
        click.echo(json.dumps(cov, indent=2, default=str))
    else:
        for line in coverage_lines(cov):
            click.echo(line)
        for mod, err in (cov.get("import_errors") or {}).items():
            click.echo(f"not importable here: {mod}: {err}", err=True)
    if cov.get("state") != "full":
        sys.exit(1)
