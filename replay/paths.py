"""Where kvtrace's bundled data and notebooks are, in a checkout and in an installed kvtrace.

Both come through the package (``replay/_bundled``, package data in ``pyproject.toml``), so
``bundled("incidents/lost_unlock")`` names the same trace from any working directory, from an
editable install of a checkout and from ``pip install`` of the repository.
"""

from __future__ import annotations

from pathlib import Path

from replay.errors import KvtraceError

_BUNDLED = Path(__file__).resolve().parent / "_bundled"


def data_dir() -> Path:
    """The bundled ``data/`` directory (traces, workloads, incidents)."""
    return (_BUNDLED / "data").resolve()


def notebooks_dir() -> Path:
    """The bundled notebooks (Jupytext ``py:percent`` files)."""
    return (_BUNDLED / "notebooks").resolve()


def bundled(relative: str) -> Path:
    """``data/<relative>`` (e.g. ``"incidents/lost_unlock"``, ``"traces/ab/baseline"``).

    Raises:
        KvtraceError: the bundled path is missing (names the path and how to regenerate it).
    """
    p = data_dir() / relative
    if not p.exists():
        raise KvtraceError(f"{p}: missing from the bundled data; expected a path under {data_dir()} "
                           "(regenerate with `make data`, or reinstall kvtrace)")
    return p
