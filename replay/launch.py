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

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
    from tracer.sglang.activation import serverinfo

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
        print(f"kvtrace launch: could not update the manifest: {e}", file=sys.stderr)


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
