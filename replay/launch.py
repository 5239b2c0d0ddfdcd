"""``kvtrace launch`` (record a live server without code changes) and ``kvtrace hooks`` (.pth).

``kvtrace launch --out DIR -- python -m sglang.launch_server --model-path M --page-size 64 ...``

1. creates the trace directory and its manifest (``server`` from the command's flags:
   ``--page-size``, ``--swa-full-tokens-ratio``, ``--chunked-prefill-size``, ``--hicache-*``...;
   each recording process later merges the values it reads from its live objects, such as pool
   sizes and the sliding window);
2. runs the command with ``KVTRACE_DIR`` (and the other ``KVTRACE_*`` options) in its environment
   and a ``sitecustomize`` shim first on ``PYTHONPATH``, so every Python process of the server
   (scheduler subprocesses included) arms the autoload; nothing is installed. An installed
   ``.pth`` (``kvtrace hooks install-pth``) does the same and the two do not conflict;
3. forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the server;
4. exits with the server's exit code (128 + N when it died of signal N) and notes the run
   (command, exit code, ranks) in the manifest.

Only this module imports ``tracer.sglang``'s autoload helpers; nothing here imports sglang.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def launch_env(out: Path, shim_dir: Path, *, detail: str, flush_ms: int, hash_block_tokens: int,
               base: dict | None = None) -> dict:
    """Environment of the launched server: ``KVTRACE_*`` options and the shim on ``PYTHONPATH``.

    Args:
        out: trace directory.
        shim_dir: directory holding the ``sitecustomize.py`` shim.
        detail, flush_ms, hash_block_tokens: recorder options.
        base: environment to extend (default ``os.environ``).
    Returns:
        A new dict.
    """
    env = dict(os.environ if base is None else base)
    env["KVTRACE_DIR"] = str(out)
    env["KVTRACE_DETAIL"] = detail
    env["KVTRACE_FLUSH_MS"] = str(flush_ms)
    env["KVTRACE_HASH_BLOCK_TOKENS"] = str(hash_block_tokens)
    env.pop("KVTRACE_AUTOLOAD", None)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(shim_dir) + (os.pathsep + old if old else "")
    return env


def write_launch_manifest(out: Path, argv: list[str], *, detail: str, flush_ms: int,
                          hash_block_tokens: int) -> dict:
    """Create the trace manifest (first writer wins) with the server config parsed from argv."""
    from tracer.schema import manifest
    from tracer.sglang import serverinfo

    server = serverinfo.from_argv(argv)
    m = manifest.new_manifest(
        source="sglang-hooks", server=server, hash_block_tokens=hash_block_tokens,
        options={"detail": detail, "flush_interval_ms": flush_ms},
        launch={"argv": list(argv), "started_unix_ns": time.time_ns(), "pid": os.getpid()},
    )
    return manifest.create_or_join(out, m)


def finish_manifest(out: Path, exit_code: int) -> None:
    """Record the server's exit code and end time in the manifest (best effort)."""
    from tracer.schema import manifest

    def note(m: dict) -> None:
        launch = m.setdefault("launch", {}) or {}
        launch.update(exit_code=exit_code, ended_unix_ns=time.time_ns())
        m["launch"] = launch

    try:
        manifest.update_manifest(out, note)
    except Exception as e:  # the trace stays readable without it
        click.echo(f"kvtrace launch: could not update the manifest: {e}", err=True)


def run_forwarding(cmd: list[str], env: dict) -> int:
    """Run ``cmd``, forwarding termination signals to it; return its exit code.

    Returns:
        The exit status, or 128 + N when the child died of signal N.
    Raises:
        FileNotFoundError: the program does not exist.
    """
    proc = subprocess.Popen(cmd, env=env)
    previous = {}

    def forward(signum, _frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    for name in FORWARDED_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            try:
                previous[sig] = signal.signal(sig, forward)
            except (ValueError, OSError):  # not the main thread / not supported
                pass
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # SIGINT arrived before our handler: keep waiting
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - rc if rc < 0 else rc


@click.command(
    "launch",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Trace directory to create (each server process writes its own rank).")
@click.option("--detail", type=click.Choice(["counts", "pages"]), default="counts", show_default=True,
              help="'pages' also records page ids of every pool op (costs a device sync per op).")
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
    if out.exists() and any(out.iterdir()):
        if not force:
            raise click.UsageError(f"{out} is not empty; pass --force to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    from tracer.sglang import autoload

    write_launch_manifest(out, cmd, detail=detail, flush_ms=flush_ms,
                          hash_block_tokens=hash_block_tokens)
    shim_dir = Path(tempfile.mkdtemp(prefix="kvtrace-launch-"))
    try:
        autoload.write_launch_shim(shim_dir)
        env = launch_env(out, shim_dir, detail=detail, flush_ms=flush_ms,
                         hash_block_tokens=hash_block_tokens)
        try:
            rc = run_forwarding(cmd, env)
        except FileNotFoundError as e:
            raise click.ClickException(f"cannot run {cmd[0]!r}: {e.strerror}") from None
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
    from tracer.sglang import autoload

    p = autoload.install_pth(site_dir)
    click.echo(f"installed {p}")


@hooks.command("uninstall-pth")
@click.option("--site-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def uninstall_pth_cmd(site_dir: Path | None) -> None:
    """Remove the autoload .pth file."""
    from tracer.sglang import autoload

    click.echo("removed" if autoload.uninstall_pth(site_dir) else "not installed")


@hooks.command("status")
@click.option("--site-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status_cmd(site_dir: Path | None, as_json: bool) -> None:
    """Show whether the .pth is installed and current, and the supported sglang versions."""
    from tracer.sglang import autoload, hooks as sg_hooks

    st = autoload.pth_status(site_dir)
    st["supported_sglang"] = list(sg_hooks.SUPPORTED_SGLANG_VERSIONS)
    st["kvtrace_dir"] = os.environ.get("KVTRACE_DIR")
    if as_json:
        click.echo(json.dumps(st))
    else:
        for k, v in st.items():
            click.echo(f"{k}: {v}")
