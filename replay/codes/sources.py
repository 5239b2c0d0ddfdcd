"""What a code is on disk, shared by every way of preparing one (``replay.codes.prepare`` for
tarballs and directories, ``replay.codes.pypi`` for ``sglang==X`` wheels): the error a spec that
cannot be prepared raises, content hashes (the cache keys) and where a tree keeps ``sglang/``.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class CodePrepareError(RuntimeError):
    """A code spec cannot be prepared; the message names the spec and what failed."""


def _sha_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sha_tree(root: Path) -> str:
    """Hash of every ``*.py`` and data file under ``root`` (relative names and bytes)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()


def _python_dir_of(directory: Path) -> Path | None:
    for cand in (directory / "python", directory):
        if (cand / "sglang" / "__init__.py").is_file():
            return cand
    return None


@contextmanager
def staged_dir(dest: Path) -> Iterator[Path]:
    """A temporary sibling of ``dest`` to unpack into; renamed to ``dest`` when the block ends
    without an error (atomic: a reader sees all of it or nothing; when another prepare won the
    race, its ``dest`` is kept), removed in every case."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        yield tmp
        try:
            tmp.rename(dest)
        except OSError:  # another prepare won the race
            if not dest.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["CodePrepareError", "staged_dir"]
