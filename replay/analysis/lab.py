"""``kvtrace lab``: JupyterLab on the bundled notebooks with a trace/run as the notebooks' parameter.

The notebooks read their input from the ``KVTRACE_DATA`` environment variable (a trace, run
or sweep directory) and fall back to the bundled data (:mod:`replay.paths`), so they run from any
working directory and from an installed kvtrace. As root (the usual container) JupyterLab needs
``--allow-root``, which is added; arguments after ``--`` go to JupyterLab unchanged.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from replay.errors import KvtraceError
from replay.paths import notebooks_dir

ENV_VAR = "KVTRACE_DATA"
NOTEBOOKS_DIR = notebooks_dir()


def lab_command(path=None, *, port: int | None = None, no_browser: bool = False,
                lab_args=()) -> tuple[list[str], dict]:
    """(argv, extra environment) that start JupyterLab on the notebooks with ``path`` as parameter.

    ``lab_args`` are appended to JupyterLab's command line; ``--allow-root`` is added when running
    as root (unless ``lab_args`` already say it)."""
    if not NOTEBOOKS_DIR.is_dir():
        raise KvtraceError(f"{NOTEBOOKS_DIR}: missing; expected the kvtrace notebooks shipped with the "
                           "package (reinstall kvtrace)")
    env = {}
    if path is not None:
        p = Path(path).resolve()
        if not p.exists():
            raise KvtraceError(f"{path}: no such trace, run or sweep directory")
        env[ENV_VAR] = str(p)
    argv = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={NOTEBOOKS_DIR}"]
    if port:
        argv.append(f"--port={port}")
    if no_browser:
        argv.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not any(a.startswith("--allow-root") for a in lab_args):
        argv.append("--allow-root")
    return argv + list(lab_args), env


def start_lab(path=None, *, port: int | None = None, no_browser: bool = False, lab_args=()) -> int:
    """Run JupyterLab in the foreground (returns its exit status)."""
    import subprocess

    argv, env = lab_command(path, port=port, no_browser=no_browser, lab_args=lab_args)
    return subprocess.call(argv, env={**os.environ, **env})
