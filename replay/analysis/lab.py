"""``kvtrace lab``: JupyterLab on ``notebooks/`` with a trace/run as the notebooks' parameter.

The notebooks read their input from the ``KVTRACE_DATA`` environment variable (a trace, run
or sweep directory) and fall back to the bundled data in ``data/traces/``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_VAR = "KVTRACE_DATA"
NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"


def lab_command(path=None, *, port: int | None = None, no_browser: bool = False) -> tuple[list[str], dict]:
    """(argv, extra environment) that start JupyterLab on ``notebooks/`` with ``path`` as parameter."""
    if not NOTEBOOKS_DIR.is_dir():
        raise FileNotFoundError(f"{NOTEBOOKS_DIR}: missing; expected the kvtrace notebooks directory "
                                "(run from a source checkout)")
    env = {}
    if path is not None:
        p = Path(path).resolve()
        if not p.exists():
            raise FileNotFoundError(f"{path}: no such trace, run or sweep directory")
        env[ENV_VAR] = str(p)
    argv = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={NOTEBOOKS_DIR}"]
    if port:
        argv.append(f"--port={port}")
    if no_browser:
        argv.append("--no-browser")
    return argv, env


def start_lab(path=None, *, port: int | None = None, no_browser: bool = False) -> int:
    """Run JupyterLab in the foreground (returns its exit status)."""
    import subprocess

    argv, env = lab_command(path, port=port, no_browser=no_browser)
    return subprocess.call(argv, env={**os.environ, **env})
