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
from tracer.schema.hashing import PAGE_HASH_NAME

RANKS_DIR = "ranks"
# How a rank's recording ended (``state`` in its rank file; DESIGN §3). "recording" while it runs.
# ``partial`` / ``uncovered``: ended cleanly, but the hooks covered only part of the code / none
# of it (the rank file's ``coverage``); never ``complete``.
END_STATES = ("complete", "interrupted", "crashed", "recovered", "partial", "uncovered")
# A trace is fully covered only in this state (``kvtrace inspect --strict``).
COVERED_STATES = ("complete",)
_LEGACY_STATES = {"stopped": "complete", "failed": "crashed"}


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
        "page_hash": PAGE_HASH_NAME,
        "server": {},
        "env": {k: v for k, v in os.environ.items() if k.startswith("SGLANG_")},
        "ranks": [],
        "options": {},
    }
    m.update(fields)
    return m


def _atomic_write_json(path: Path, obj: dict, in_place_fallback: bool = False) -> None:
    """Write ``obj`` to ``path`` via a temporary file and a rename; never leaves the temporary
    behind. ``in_place_fallback``: when the temporary cannot be written (disk full), overwrite
    ``path`` in place (its blocks are already allocated, so a small file usually still fits)."""
    body = (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
        return
    except OSError:
        tmp.unlink(missing_ok=True)
        if not (in_place_fallback and path.is_file()):
            raise
    fd = os.open(path, os.O_WRONLY)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view):]
        os.ftruncate(fd, len(body))
    finally:
        os.close(fd)


def write_manifest(trace_dir: str | os.PathLike, manifest: dict) -> Path:
    """Write (replace) ``manifest.json`` atomically. Returns its path."""
    d = Path(trace_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / MANIFEST_FILE
    _atomic_write_json(p, manifest)
    return p


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# key -> (check, what is expected); only keys present are checked (schema_version is required).
_FIELD_TYPES = {
    "schema_version": (lambda v: isinstance(v, str), "a 'MAJOR.MINOR' string"),
    "producer": (lambda v: isinstance(v, dict), "an object {name, version, source}"),
    "created_unix_ns": (_is_int, "an integer (ns)"),
    "clock": (lambda v: isinstance(v, dict) and all(_is_int(v.get(k, 0)) for k in ("monotonic_ns", "unix_ns")),
              "an object {monotonic_ns: int, unix_ns: int}"),
    "hash_block_tokens": (lambda v: v is None or (_is_int(v) and 0 < v <= 1 << 20), "null or an integer in 1..2**20"),
    "server": (lambda v: isinstance(v, dict), "an object"),
    "env": (lambda v: isinstance(v, dict), "an object"),
    "ranks": (lambda v: isinstance(v, list) and all(_is_int(r) and 0 <= r < 1 << 20 for r in v),
              "a list of rank numbers"),
    "options": (lambda v: isinstance(v, dict), "an object"),
    "workload": (lambda v: isinstance(v, dict), "an object"),
    "launch": (lambda v: isinstance(v, dict), "an object"),
    "uncovered": (lambda v: isinstance(v, list) and all(isinstance(e, dict) for e in v),
                  "a list of objects {pid, target, reason, ...}"),
}


def validate_manifest(m, where: str) -> dict:
    """Check a manifest's shape: a JSON object whose known keys have their types. Returns it.

    Raises:
        SchemaError: ``<where>: <key> is <value>; expected <type>``.
    """
    from tracer.schema import SchemaError

    if not isinstance(m, dict):
        raise SchemaError(f"{where}: manifest holds a JSON {type(m).__name__}; expected an object")
    if "schema_version" not in m:
        raise SchemaError(f"{where}: no schema_version; expected the kvtrace manifest keys")
    for key, (ok, expected) in _FIELD_TYPES.items():
        if key in m and not ok(m[key]):
            shown = json.dumps(m[key], default=str)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise SchemaError(f"{where}: {key} is {shown}; expected {expected}")
    return m


def read_manifest(trace_dir: str | os.PathLike) -> dict:
    p = Path(trace_dir) / MANIFEST_FILE
    try:
        m = json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: no manifest.json (not a kvtrace trace directory?)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        from tracer.schema import SchemaError

        raise SchemaError(f"{p}: manifest is not valid JSON ({e})") from None
    return validate_manifest(m, str(p))


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
    """Replace a rank file (atomically; in place when the disk is too full for a temporary)."""
    p = Path(trace_dir) / RANKS_DIR / f"rank={rank}.json"
    _atomic_write_json(p, info, in_place_fallback=True)


def rank_file(trace_dir: str | os.PathLike, rank: int) -> Path:
    return Path(trace_dir) / RANKS_DIR / f"rank={rank}.json"


def read_rank_info(trace_dir: str | os.PathLike, rank: int) -> dict | None:
    """A rank file's object (None when absent). Raises SchemaError when it is not a JSON object."""
    from tracer.schema import SchemaError

    p = rank_file(trace_dir, rank)
    try:
        info = json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SchemaError(f"{p}: not valid JSON ({e}); expected the rank's JSON object") from None
    if not isinstance(info, dict):
        raise SchemaError(f"{p}: holds a JSON {type(info).__name__}; expected an object")
    return info


def hold_rank_lock(trace_dir: str | os.PathLike, rank: int) -> int | None:
    """Take the rank's liveness lock (``ranks/rank=<r>.lock``, an exclusive ``flock``) for as long
    as the returned descriptor stays open; the kernel releases it when the process dies, however
    it dies. Returns None when locking is not possible here (the pid check still applies)."""
    try:
        fd = os.open(Path(trace_dir) / RANKS_DIR / f"rank={rank}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def rank_is_live(trace_dir: str | os.PathLike, rank: int, info: dict | None) -> bool:
    """Whether a process is still recording ``rank``: its lock is held, or (no lock file) the
    rank file says "recording" and names a live pid on this host."""
    lock = Path(trace_dir) / RANKS_DIR / f"rank={rank}.lock"
    if lock.exists():
        try:
            fd = os.open(lock, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    if not info or info.get("state") != "recording":
        return False
    import socket

    if info.get("host") not in (None, socket.gethostname()):
        return True  # another host's process: cannot tell, assume it runs
    try:
        pid = int(info.get("pid", -1))
    except (ValueError, TypeError, OverflowError):
        return True
    return pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host may still run (one we may not signal counts as
    running; a pid out of range counts as running, as nothing can be told of it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def coverage_end_state(coverage: dict | None) -> str:
    """The end state of a clean stop given a rank's ``coverage`` (None: not sglang hooks):
    ``complete``, ``partial`` or ``uncovered``."""
    if not isinstance(coverage, dict):
        return "complete"
    state = coverage.get("trace_state")
    return state if state in ("complete", "partial", "uncovered") else "partial"


def uncovered_processes(manifest: dict) -> list:
    """The manifest's ``uncovered`` entries: processes that found no covered target and
    recorded nothing (``kvtrace launch`` without ``--partial``)."""
    u = manifest.get("uncovered") if isinstance(manifest, dict) else None
    return list(u) if isinstance(u, list) else []


def note_uncovered(trace_dir: str | os.PathLike, entry: dict) -> None:
    """Add one process's ``uncovered`` entry to the manifest (under its lock; one per pid)."""

    def add(m: dict) -> None:
        got = [e for e in uncovered_processes(m) if e.get("pid") != entry.get("pid")]
        m["uncovered"] = got + [entry]

    update_manifest(trace_dir, add)


def end_state(info: dict | None, live: bool) -> str:
    """How a rank ended: one of END_STATES, "recording" (live), or "unknown" (no rank file).
    A rank file still saying "recording" whose process is gone ended as "crashed"."""
    if info is None:
        return "unknown"
    state = _LEGACY_STATES.get(info.get("state"), info.get("state"))
    if state == "recording":
        return "recording" if live else "crashed"
    return state if state in END_STATES else "unknown"
