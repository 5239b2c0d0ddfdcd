"""One rule for output directories (``--out`` of record, launch, workload generate/import).

A new output may go to a path that does not exist or is an empty directory. ``--force``
replaces an existing one only when it is a kvtrace trace, run or workload (it holds a
``manifest.json`` written by kvtrace) or a sweep (``sweep.json``); anything else is refused,
never deleted. Every command that writes an output directory takes ``--force`` (record, replay,
sweep, compact --out, launch, workload generate/import/from-trace).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from replay.errors import KvtraceError


def is_kvtrace_dir(path: Path) -> bool:
    """``path`` holds a kvtrace trace, run or workload (a manifest whose producer is kvtrace) or a
    sweep (``sweep.json`` naming its source and policies, written by ``kvtrace sweep``)."""
    try:
        m = json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError):
        m = None
    if isinstance(m, dict) and isinstance(m.get("producer"), dict) and m["producer"].get("name") == "kvtrace":
        return True
    try:
        sw = json.loads((Path(path) / "sweep.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(sw, dict) and "source" in sw and isinstance(sw.get("policies"), list)


def check_new_dir(out: str | Path, option: str = "--out", force: bool = False, error=KvtraceError) -> bool:
    """Check that ``out`` can be written as a new directory; returns True when an existing
    kvtrace directory is to be replaced (``force``). Changes nothing.

    Raises:
        error (KvtraceError by default): a parent or ``out`` is a file, or ``out`` is a non-empty
            directory (without ``force``, or with it when it is not a kvtrace trace/workload).
    """
    out = Path(out)
    for p in [out, *out.parents]:
        if p.exists() and not p.is_dir():
            what = "is a file" if p == out else f"(a parent of {out}) is a file"
            raise error(f"{option} {out}: {p} {what}; expected a directory path")
    if not out.is_dir() or not any(out.iterdir()):
        return False
    if not is_kvtrace_dir(out):
        raise error(f"{option} {out}: a non-empty directory that is not a kvtrace trace or workload; "
                    "expected a new or empty directory (--force replaces only kvtrace directories)")
    if not force:
        raise error(f"{option} {out}: already exists, a kvtrace directory "
                    "(use --force to replace it)")
    return True


def replace_dir(out: str | Path, option: str = "--out", force: bool = False, error=KvtraceError) -> None:
    """``check_new_dir`` then remove an existing kvtrace directory (``force``) and create ``out``."""
    out = Path(out)
    if check_new_dir(out, option, force, error):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


__all__ = ["is_kvtrace_dir", "check_new_dir", "replace_dir"]
