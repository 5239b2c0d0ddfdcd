"""Safe recovery of a trace a recorder left behind (``kvtrace recover``).

``recover(path)``:

1. refuses a trace that is still being recorded (a rank whose liveness lock is held, or whose
   rank file says "recording" and names a live pid on this host) unless ``force``;
2. refuses open segments under a folder that is not a known family (nothing is touched);
3. converts every open ``*.arrows`` segment to Parquet, keeping every complete record batch;
   a torn or unreadable stream is moved aside to ``*.arrows.unreadable``, never deleted; if the
   Parquet file cannot be written (disk full) the stream is left as it was and the error raised;
4. accounts for every rank it touched: events issued (the largest seq on disk, or the rank
   file's ``issued``) minus rows on disk minus losses already counted in ``drops`` is written
   as one ``drops`` row with reason ``torn``, so a loss is never silent;
5. marks each such rank's file ``state: recovered`` (with the state it was found in).

The returned :class:`RecoveryReport` says what was recovered and lost; ``lost`` is true when
anything was (the CLI then exits 1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from replay.errors import KvtraceError
from tracer.schema import FAMILIES, MANIFEST_FILE, DropReason, SchemaError
from tracer.schema import manifest as _manifest
from tracer.schema.storage import OPEN_SUFFIX, UNREADABLE_SUFFIX, recover_segment, write_family_table


@dataclass(frozen=True)
class RecoveryReport:
    """What ``recover`` did (the ``--json`` object of ``kvtrace recover``)."""

    path: str
    segments_recovered: int
    rows_recovered: int
    torn: list[str] = field(default_factory=list)  # "<file>: <why reading stopped>"
    moved_aside: list[str] = field(default_factory=list)  # *.arrows.unreadable files
    lost_events: dict[int, int] = field(default_factory=dict)  # rank -> events newly counted lost
    ranks_marked: list[int] = field(default_factory=list)
    forced_live_ranks: list[int] = field(default_factory=list)
    #: a dead recorder's half-written rank files (``ranks/.rank=R.json.<pid>.tmp``), removed
    stale_temporaries: list[str] = field(default_factory=list)

    @property
    def lost(self) -> bool:
        return bool(self.moved_aside) or any(self.lost_events.values())

    def to_dict(self) -> dict:
        return {"path": self.path, "segments_recovered": self.segments_recovered,
                "rows_recovered": self.rows_recovered, "torn": self.torn,
                "moved_aside": self.moved_aside,
                "lost_events": {str(k): v for k, v in self.lost_events.items()},
                "ranks_marked": self.ranks_marked, "forced_live_ranks": self.forced_live_ranks,
                "stale_temporaries": self.stale_temporaries, "lost": self.lost}


def recover(path: str | Path, *, force: bool = False) -> RecoveryReport:
    """Convert the open segments of the trace at ``path`` and count what could not be kept.

    Args:
        path: trace directory.
        force: recover even ranks that are still recording (their later writes are lost).
    Raises:
        KvtraceError: not a trace, a live recording (without ``force``), open segments under an
            unknown family folder, or a write failure (disk full; nothing was deleted).
        SchemaError: a manifest or rank file that is not a JSON object.
    """
    root = Path(path)
    if not (root / MANIFEST_FILE).is_file():
        raise KvtraceError(f"{root / MANIFEST_FILE}: missing; expected a kvtrace trace directory")
    _manifest.read_manifest(root)  # a manifest that is not an object is refused here
    found = sorted(root.glob(f"*/rank=*/part-*{OPEN_SUFFIX}"))
    unknown = sorted({str(f.parent.parent) for f in found if f.parent.parent.name not in FAMILIES})
    if unknown:
        raise KvtraceError(f"{', '.join(unknown)}: open segments under a folder that is not a trace "
                           f"family; expected only {', '.join(FAMILIES)}. Nothing was changed; move "
                           "the folder out of the trace and rerun")
    ranks = sorted({_rank_of(f) for f in found} | set(_rank_files(root)))
    infos = {r: _manifest.read_rank_info(root, r) for r in ranks}
    live = [r for r in ranks if _manifest.rank_is_live(root, r, infos[r])]
    if live and not force:
        who = "; ".join(_who(root, r, infos[r]) for r in live)
        raise KvtraceError(f"{root}: still being recorded ({who}); recover a trace only after its "
                           "recorder has exited, or pass --force (the live recorder's later writes "
                           "are then lost). Nothing was changed")
    segments, rows, torn, aside = 0, 0, [], []
    touched = set()
    for f in found:
        try:
            n, note = recover_segment(f, keep_unreadable=True)
        except OSError as e:
            raise KvtraceError(f"{f}: could not write its Parquet conversion ({e.strerror or e}); the "
                               "open segment was kept as it was. Free space and rerun") from None
        segments += 1
        rows += n
        touched.add(_rank_of(f))
        if note:
            torn.append(f"{f}: {note}")
            moved = f.with_name(f.name + UNREADABLE_SUFFIX)
            if moved.exists():
                aside.append(str(moved))
    lost, marked = {}, []
    for r in ranks:
        state = _manifest.end_state(infos[r], r in live)
        if r not in touched and state in ("complete", "partial", "uncovered", "recovered", "unknown",
                                           "interrupted"):
            continue
        try:
            lost[r] = _count_losses(root, r, infos[r], torn)
            if infos[r] is not None:
                _mark_recovered(root, r, infos[r], state, lost[r])
                marked.append(r)
        except OSError as e:
            raise KvtraceError(f"{root}: rank {r}: could not write the recovery accounting "
                               f"({e.strerror or e}). Free space and rerun") from None
    stale = _remove_stale_temporaries(root, [r for r in ranks if r not in live])
    return RecoveryReport(str(root), segments, rows, torn, aside, lost, marked, live, stale)


def _remove_stale_temporaries(root: Path, ranks: list[int]) -> list[str]:
    """Remove the rank-file temporaries a recorder killed between writing and renaming left
    (``ranks/.rank=R.json.<pid>.tmp`` of a rank not recording, its writer's pid gone): the rank
    file they would have replaced is whole (the rename is atomic) and recovery rewrote it."""
    removed = []
    for r in ranks:
        for p in sorted((root / _manifest.RANKS_DIR).glob(f".rank={r}.json.*.tmp")):
            pid = p.name[len(f".rank={r}.json."):-len(".tmp")]
            if pid.isdigit() and not _manifest.pid_alive(int(pid)):
                try:
                    p.unlink()
                    removed.append(str(p))
                except FileNotFoundError:
                    pass
                except OSError as e:
                    raise KvtraceError(f"{p}: could not remove this stale temporary ({e.strerror or e})") from None
    return removed


def _rank_of(f: Path) -> int:
    return int(f.parent.name.split("=", 1)[1])


def _rank_files(root: Path) -> list[int]:
    out = []
    for p in (root / _manifest.RANKS_DIR).glob("rank=*.json"):
        try:
            out.append(int(p.stem.split("=", 1)[1]))
        except ValueError:
            continue
    return out


def _who(root: Path, rank: int, info: dict | None) -> str:
    info = info or {}
    return (f"rank {rank}: pid {info.get('pid', '?')} on {info.get('host', '?')}, "
            f"{root / _manifest.RANKS_DIR / f'rank={rank}.lock'} is held")


def rank_accounting(root: Path, rank: int) -> dict:
    """Rows per family, total rows, largest seq/ts and events counted in ``drops`` for a rank,
    from the closed Parquet parts (footers only, plus the drops rows)."""
    rows = {f: 0 for f in FAMILIES}
    max_seq, max_ts, dropped = 0, 0, 0
    for fam in FAMILIES:
        for p in sorted((root / fam / f"rank={rank}").glob("part-*.parquet")):
            try:
                md = pq.ParquetFile(p).metadata
            except Exception:  # unreadable parts are the reader's problem (Trace.check)
                continue
            rows[fam] += md.num_rows
            names = md.schema.to_arrow_schema().names
            for g in range(md.num_row_groups):
                for col, which in (("seq", 0), ("ts_ns", 1)):
                    if col not in names:
                        continue
                    st = md.row_group(g).column(names.index(col)).statistics
                    if st is not None and st.has_min_max:
                        if which == 0:
                            max_seq = max(max_seq, int(st.max))
                        else:
                            max_ts = max(max_ts, int(st.max))
            if fam == "drops":
                dropped += int(pa.compute.sum(pq.read_table(p, columns=["num_events"])
                                              .column("num_events")).as_py() or 0)
    return {"rows": rows, "total_rows": sum(rows.values()), "max_seq": max_seq, "max_ts": max_ts,
            "dropped": dropped}


def _count_losses(root: Path, rank: int, info: dict | None, torn: list[str]) -> int:
    """Write one ``drops`` row (reason torn) for the events of ``rank`` issued but neither on
    disk nor already counted; returns how many."""
    acc = rank_accounting(root, rank)
    info = info or {}
    issued = max(acc["max_seq"], int(info.get("issued") or 0), int(info.get("flushed_seq") or 0))
    missing = issued - acc["total_rows"] - acc["dropped"]
    if missing <= 0:
        return 0
    fams = sorted({Path(t.split(":", 1)[0]).parent.parent.name for t in torn
                   if Path(t.split(":", 1)[0]).parent.name == f"rank={rank}"})
    detail = (f"kvtrace recover: {missing} events issued before seq {issued} are not on disk"
              + (f" (torn or unreadable segments of {', '.join(fams)})" if fams
                 else " (not flushed before the recorder stopped)"))
    table = pa.table({"ts_ns": [acc["max_ts"]], "seq": [issued + 1],
                      "family": [""], "first_seq": [-1],
                      "last_seq": [-1], "num_events": [missing], "reason": [int(DropReason.TORN)],
                      "detail": [detail]})
    write_family_table(root, "drops", table, rank=rank)
    return missing


def _mark_recovered(root: Path, rank: int, info: dict, found_state: str, lost: int) -> None:
    acc = rank_accounting(root, rank)
    new = dict(info, state="recovered", recovered_from=found_state, recovered_unix_ns=time.time_ns(),
               events=acc["rows"], dropped=acc["dropped"], lost=0, issued=acc["max_seq"])
    _manifest.update_rank_info(root, rank, new)


__all__ = ["RecoveryReport", "recover", "rank_accounting", "SchemaError"]
