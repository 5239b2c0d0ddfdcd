"""Offline compaction of a trace's prompt chains (``kvtrace compact``): schema 1.2 *positions*.

The live capture stores each arrival's chain as a reference to an earlier request plus the new
blocks' 64-bit hashes (schema 1.1, ``tracer.schema.prefixes``); those hashes, random 64-bit
values, are most of a recording's bytes. With the whole trace in view every repeated block can
be a reference, and then a new block needs no stored value: its identity is its position (the
row that introduced it, block index). :func:`compact_trace` rewrites the ``request`` family so
that an arrival stores only ``prefix_rid``, ``prefix_blocks``, ``new_blocks`` and ``tip_hash``
(the original hash of its last block); the reader synthesizes each new block's value
(``tracer.schema.prefixes.synth_values``), distinct within a rank by construction.

Exact, or refused: the compacted chains must have the same equality structure as the original
ones (for every pair of requests, the same common-prefix length), which is checked on the file
written before anything is replaced. Refused (nothing changed): a trace with problems (open,
unreadable or missing segments, unresolvable prefixes), still being recorded, already compacted,
whose hashes are not chained (equal values with different prefixes), with a block shared across
ranks (values are synthesized per rank), or with a repeated block that cannot be a reference.

Every other file (other families, rank files, a run's ``summary.json``) is kept as it is.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from replay.errors import KvtraceError
from replay.outdir import check_new_dir
from tracer.schema import REQUEST, SCHEMA_VERSION
from tracer.schema.hashing import chain, fmix64
from tracer.schema.manifest import update_manifest
from tracer.schema.prefixes import SALT_META, encode_chains, expand_request_table
from tracer.schema.storage import to_stored, write_parquet

_SEED = 0x6B76747261636521  # b"kvtrace!": workloads have created_unix_ns 0
_STAGE = ".compact-"  # staging folder prefix (inside the trace for --in-place, next to it for --out)


class CompactError(KvtraceError):
    """A trace that cannot be compacted exactly; nothing was changed."""


@dataclass(frozen=True, slots=True)
class CompactResult:
    """What :func:`compact_trace` did. Sizes are whole directories (every file)."""

    trace: str  # the compacted trace (``out``, or ``src`` in place)
    source: str
    bytes_before: int
    bytes_after: int
    request_bytes_before: int
    request_bytes_after: int
    mb_per_rank_hour_before: float | None
    mb_per_rank_hour_after: float | None
    ranks: int
    rows: int  # request rows
    arrivals: int  # rows with a chain
    blocks: int  # blocks over all chains
    distinct_blocks: int
    hashes_stored_before: int
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def compact_trace(src, out=None, *, in_place: bool = False, progress: bool = False) -> CompactResult:
    """Rewrite the ``request`` family of trace ``src`` in positions form (schema 1.2).

    Args:
        src: trace or run directory.
        out: new directory to write the compacted copy to (must not exist, or be empty).
        in_place: compact ``src`` itself: the new files are written and verified next to the
            old ones, then swapped in with one atomic directory exchange.
        progress: progress bar on stderr.

    Returns:
        A :class:`CompactResult`.

    Raises:
        CompactError: refused (see the module docstring); nothing was changed.
    """
    from replay.inspection import summarize

    t0 = time.perf_counter()
    src = Path(src)
    if (out is None) == (not in_place):
        raise CompactError(f"{src}: give exactly one of --out DIR and --in-place")
    if out is not None:
        check_new_dir(out, error=CompactError)
    before = summarize(src)
    tr = _open_checked(src)
    salt = _salt(tr.manifest)
    ranks = sorted({s.rank for s in tr.segments if s.family == "request"})
    bar = tqdm(total=4 * len(ranks), desc="compact", unit="step", disable=not progress, leave=False)
    tables, origs, stats, seen = {}, {}, [], {}
    for r in ranks:
        bar.set_postfix_str(f"rank {r}: read")
        origs[r] = orig = _sorted(tr.table("request", r).drop_columns(["rank"]))
        _check_problems(tr)
        bar.update()
        bar.set_postfix_str(f"rank {r}: encode")
        tables[r], st, values = _compact_rank(orig, salt, r, f"{src}/request/rank={r}")
        for other, v in seen.items():
            shared = int(np.isin(values, v, assume_unique=True).sum())
            if shared:
                raise CompactError(f"{src}: {shared} block hashes occur on both rank {other} and rank {r}; "
                                   "expected each rank's blocks to be its own (compacted values are "
                                   "synthesized per rank, so equality across ranks would be lost)")
        seen[r] = values
        stats.append(st)
        bar.update()
    stage = (src if in_place else Path(out).resolve().parent) / f"{_STAGE}{os.getpid()}"
    try:
        new_dir = stage / "request" if in_place else stage / "trace"
        if not in_place:
            shutil.copytree(src, new_dir, ignore=lambda d, names: [
                n for n in names if n == "request" or n.startswith(_STAGE)] if Path(d) == src else [])
        for r, t in tables.items():
            path = (new_dir / f"rank={r}" if in_place else new_dir / "request" / f"rank={r}") / "part-00000.parquet"
            path.parent.mkdir(parents=True)
            bar.set_postfix_str(f"rank {r}: write")
            write_parquet(path, t)
            bar.update()
            bar.set_postfix_str(f"rank {r}: verify")
            _verify(path, origs.pop(r), r)
            bar.update()
        if in_place:
            _exchange(new_dir, src / "request")  # the one atomic step; the old files are now in new_dir
            dest = src
        else:
            os.rename(new_dir, out)
            dest = Path(out)
        update_manifest(dest, lambda m: m.update(chain_storage="positions", schema_version=SCHEMA_VERSION))
    finally:
        bar.close()
        shutil.rmtree(stage, ignore_errors=True)
    after = summarize(dest)
    return CompactResult(
        trace=str(dest), source=str(src), bytes_before=before["bytes"], bytes_after=after["bytes"],
        request_bytes_before=sum(s.num_bytes for s in tr.segments if s.family == "request"),
        request_bytes_after=sum(p.stat().st_size for p in (dest / "request").rglob("*.parquet")),
        mb_per_rank_hour_before=before["mb_per_rank_hour"], mb_per_rank_hour_after=after["mb_per_rank_hour"],
        ranks=len(ranks), rows=sum(s["rows"] for s in stats), arrivals=sum(s["arrivals"] for s in stats),
        blocks=sum(s["blocks"] for s in stats), distinct_blocks=sum(s["distinct"] for s in stats),
        hashes_stored_before=_hashes_stored(tr),
        seconds=round(time.perf_counter() - t0, 3))


# ------------------------------------------------------------------------------ checks
def _open_checked(src: Path):
    from replay.inspection import rank_states
    from replay.trace import TraceError, open_trace

    try:
        tr = open_trace(src, strict=True)
    except TraceError as e:
        raise CompactError(f"{e}; expected a complete trace (compact refuses to rewrite a damaged one)") from None
    live = [r for r, st in rank_states(tr).items() if st == "recording"]
    if live:
        raise CompactError(f"{src}: rank(s) {live} still recording; expected a finished trace")
    if tr.manifest.get("chain_storage") == "positions" or any(
            _file_salt(s.path) is not None for s in tr.segments if s.family == "request"):
        raise CompactError(f"{src}: already compacted (manifest chain_storage 'positions'); nothing to do")
    if not any(s.family == "request" for s in tr.segments):
        raise CompactError(f"{src}: no request rows; expected a trace with the request family")
    return tr


def _check_problems(tr) -> None:
    if tr.problems:
        raise CompactError(f"{tr.problems[0]}; expected every chain to be readable "
                           "(compact refuses a trace whose chains cannot all be rebuilt)")


def _file_salt(path: Path):
    import pyarrow.parquet as pq

    return (pq.read_schema(path).metadata or {}).get(SALT_META)


def _salt(manifest: dict) -> int:
    """The trace's chain salt: derived from its creation time and clock anchor, so compacting
    the same trace twice gives the same values."""
    clock = manifest.get("clock") or {}
    seed = int(manifest.get("created_unix_ns") or 0) ^ (int(clock.get("monotonic_ns") or 0) << 1) ^ _SEED
    return int(fmix64(np.array([seed & ((1 << 64) - 1)], np.uint64))[0])


def _sorted(t: pa.Table) -> pa.Table:
    return t.take(pa.array(np.argsort(t.column("seq").to_numpy(), kind="stable")))


def _chains(t: pa.Table):
    """(valid mask, flat uint64, offsets over the valid rows) of a table's page_hashes."""
    h = t.column("page_hashes").combine_chunks()
    valid = ~pc.is_null(h).to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.list_value_length(h), 0).to_numpy().astype(np.int64)[valid]
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pc.list_flatten(h).to_numpy(zero_copy_only=False).astype(np.uint64)
    return valid, flat, offsets


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether equal elements of ``a`` are exactly the equal elements of ``b`` (same length)."""
    if len(a) != len(b):
        return False
    if len(a) == 0:
        return True
    o = np.lexsort((b, a))  # by a, then b
    a, b = a[o], b[o]
    new_a, new_b = a[1:] != a[:-1], b[1:] != b[:-1]
    groups = int(new_a.sum()) + 1
    # no a-group holds two b values, and as many distinct b values as a-groups
    return int((new_a | new_b).sum()) + 1 == groups and len(np.unique(b)) == groups


# ------------------------------------------------------------------------------ one rank
def _compact_rank(orig: pa.Table, salt: int, rank: int, where: str):
    """(stored table, stats, distinct values) of one rank's request rows in positions form."""
    valid, flat, offsets = _chains(orig)
    lengths = np.diff(offsets)
    ident = chain(flat, lengths)
    if not same_partition(flat, ident):
        raise CompactError(f"{where}: equal page hashes at different prefixes; expected chained hashes "
                           "(each value standing for its whole prefix) to compact without changing "
                           "what readers see")
    distinct = np.unique(flat)
    rids = orig.column("rid").to_numpy()[valid]
    prid, pblk, new, new_off = encode_chains(rids, flat, offsets)
    if len(new) != len(distinct):
        dup = int(len(rids) - len(np.unique(rids)))
        raise CompactError(f"{where}: {len(new) - len(distinct)} repeated blocks cannot be stored as "
                           f"references ({dup} arrivals share a rid with another); expected every "
                           "repeated block to be a reference")
    n = orig.num_rows
    rows = np.flatnonzero(valid)
    full = lambda values, fill, typ: _scatter(n, rows, values, fill, typ)  # noqa: E731
    tip = np.where(lengths > 0, flat[np.maximum(offsets[1:] - 1, 0)] if len(flat) else 0, 0).astype(np.uint64)
    empty = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.uint64()),
                                     mask=pa.array(~valid))
    names = orig.column_names
    t = orig.set_column(names.index("page_hashes"), "page_hashes", empty)
    for name, values, fill, typ in (("prefix_rid", prid, -1, np.int64), ("prefix_blocks", pblk, 0, np.int32),
                                    ("new_blocks", np.diff(new_off), -1, np.int32), ("tip_hash", tip, 0, np.uint64)):
        t = t.set_column(names.index(name), name, pa.array(full(values, fill, typ)))
    stored = to_stored(t, REQUEST)
    stored = stored.replace_schema_metadata({**stored.schema.metadata, SALT_META: str(salt).encode()})
    st = {"rows": n, "arrivals": int(valid.sum()), "blocks": int(len(flat)), "distinct": int(len(distinct))}
    return stored, st, distinct


def _scatter(n, rows, values, fill, typ):
    out = np.full(n, fill, typ)
    out[rows] = values
    return out


def _hashes_stored(tr) -> int:
    """Page hashes the trace's request files hold (before compaction: the new blocks' hashes)."""
    import pyarrow.parquet as pq

    return sum(int(pc.sum(pc.list_value_length(pq.read_table(s.path, columns=["page_hashes"]).column(0))).as_py() or 0)
               for s in tr.segments if s.family == "request")


def _verify(path: Path, orig: pa.Table, rank: int) -> None:
    """The written file, read and expanded as the reader does, has the original rows and the
    original equality structure; else CompactError (the caller then removes the staging)."""
    import pyarrow.parquet as pq

    raw = pq.read_table(path)
    got, problems = expand_request_table(raw, salt=int(raw.schema.metadata[SALT_META]), rank=rank)
    where = f"{path} (compacted)"
    if problems:
        raise CompactError(f"{where}: {problems[0]}")
    keep = [c for c in orig.column_names if c not in ("page_hashes", "prefix_rid", "prefix_blocks",
                                                      "new_blocks", "tip_hash")]
    for c in keep:
        if not got.column(c).equals(orig.column(c)):
            raise CompactError(f"{where}: column {c} differs from the original; expected it unchanged")
    va, fa, oa = _chains(orig)
    vb, fb, ob = _chains(got)
    if not (np.array_equal(va, vb) and np.array_equal(oa, ob)):
        raise CompactError(f"{where}: chain lengths differ from the original; expected the same blocks")
    if not same_partition(fa, fb):
        raise CompactError(f"{where}: equal blocks differ from the original's; expected the same "
                           "equality structure")


# ------------------------------------------------------------------------------ swap
_RENAME_EXCHANGE = 2


def _exchange(new: Path, old: Path) -> None:
    """Swap two directories atomically (``renameat2(RENAME_EXCHANGE)``): readers see either the
    old request files or the new ones, never a mix. Where the kernel or file system lacks it,
    two renames (a crash between them leaves the old files in the staging folder, named in
    the error a rerun gives)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        AT_FDCWD = -100
        if fn(AT_FDCWD, os.fsencode(new), AT_FDCWD, os.fsencode(old), _RENAME_EXCHANGE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(old))
    aside = new.with_name(new.name + ".old")
    os.rename(old, aside)
    os.rename(new, old)
    os.rename(aside, new)


__all__ = ["compact_trace", "CompactResult", "CompactError", "same_partition"]
