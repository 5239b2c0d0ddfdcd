"""Trace manifest (``manifest.json``) and per-process rank files (``ranks/rank=<r>.json``).

The manifest is created once per trace, atomically and first-writer-wins, so that several
processes (a server and its scheduler subprocesses) can join the same trace directory and share
its clock anchor. Each process then claims a rank with an exclusive create of its rank file.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from tracer.schema import MANIFEST_FILE, PRODUCER, SCHEMA_VERSION

RANKS_DIR = "ranks"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("kvtrace")
    except Exception:  # not installed (running from a checkout)
        return "0+unknown"


def new_manifest(*, source: str = "tracer", **fields) -> dict:
    """A manifest dict with every required key; ``fields`` override or extend it."""
    mono, unix = time.monotonic_ns(), time.time_ns()
    m = {
        "schema_version": SCHEMA_VERSION,
        "producer": {"name": PRODUCER, "version": _version(), "source": source},
        "created_unix_ns": unix,
        "clock": {"monotonic_ns": mono, "unix_ns": unix},
        "hash_block_tokens": None,
        "server": {},
        "env": {k: v for k, v in os.environ.items() if k.startswith("SGLANG_")},
        "ranks": [],
        "options": {},
    }
    m.update(fields)
    return m


def _atomic_write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def write_manifest(trace_dir: str | os.PathLike, manifest: dict) -> Path:
    """Write (replace) ``manifest.json`` atomically. Returns its path."""
    d = Path(trace_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / MANIFEST_FILE
    _atomic_write_json(p, manifest)
    return p


def read_manifest(trace_dir: str | os.PathLike) -> dict:
    p = Path(trace_dir) / MANIFEST_FILE
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no manifest.json (not a kvtrace trace directory?)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: manifest is not valid JSON ({e})") from None


def create_or_join(trace_dir: str | os.PathLike, manifest: dict) -> dict:
    """Create ``manifest.json`` if absent (atomic, first writer wins); return the one in force.

    A joining process adopts the existing manifest, in particular its clock anchor.
    """
    d = Path(trace_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / MANIFEST_FILE
    tmp = d / f".{MANIFEST_FILE}.{os.getpid()}.new"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
    try:
        os.link(tmp, p)  # fails if a manifest already exists
        return manifest
    except FileExistsError:
        return read_manifest(d)
    finally:
        tmp.unlink(missing_ok=True)


def update_manifest(trace_dir: str | os.PathLike, fn) -> dict:
    """Read-modify-write the manifest under an advisory lock; ``fn(dict) -> None`` mutates it."""
    d = Path(trace_dir)
    with open(d / ".manifest.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        m = read_manifest(d)
        fn(m)
        write_manifest(d, m)
        return m


def claim_rank(trace_dir: str | os.PathLike, rank: int | None, info: dict) -> int:
    """Claim a rank for this process: the given one, or the lowest free one when ``None``.

    Mutates: creates ``ranks/rank=<r>.json`` (exclusive create when auto-allocating) and adds the
    rank to the manifest's ``ranks`` list.
    """
    rd = Path(trace_dir) / RANKS_DIR
    rd.mkdir(parents=True, exist_ok=True)
    body = json.dumps(info, indent=2, sort_keys=True, default=str) + "\n"
    if rank is not None:
        (rd / f"rank={rank}.json").write_text(body)
    else:
        rank = 0
        while True:
            try:
                fd = os.open(rd / f"rank={rank}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                rank += 1
                continue
            with os.fdopen(fd, "w") as f:
                f.write(body)
            break

    def add(m: dict) -> None:
        m["ranks"] = sorted(set(m.get("ranks") or []) | {rank})

    update_manifest(trace_dir, add)
    return rank


def update_rank_info(trace_dir: str | os.PathLike, rank: int, info: dict) -> None:
    p = Path(trace_dir) / RANKS_DIR / f"rank={rank}.json"
    _atomic_write_json(p, info)
