"""The full checks behind ``Trace.check()`` and ``kvtrace inspect --strict``.

Each check returns :class:`Problem` items (re-exported as ``replay.trace.Problem``) naming the file (and row) and what was
expected:

- ``seq``: seq strictly increasing within a segment and unique per rank (a duplicated segment);
- ``ranks``: rank folders of the families agree with the manifest's ``ranks`` and the rank files;
- ``count``: rows per family of a rank agree with the ``events`` its rank file recorded (a
  segment with part of its rows, a duplicated or removed segment);
- ``gap``: per rank, the largest seq = rows on disk + events counted lost in ``drops``; a
  positive difference is a loss nobody counted, a negative one rows that appear twice;
- ``state``: every rank ended ``complete`` (``interrupted``, ``crashed``, ``recovered`` or still
  ``recording`` are reported);
- ``drops``: every recorded loss (reported, so a strict inspection fails on any loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from tracer.schema import FAMILIES
from tracer.schema import manifest as _manifest


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a trace: its kind, the file (and row) and what was expected."""

    kind: str  # corrupt | truncated | missing | open_segment | version | schema | seq | drops
    file: str
    message: str
    row: int | None = None

    def __str__(self) -> str:
        where = self.file + (f", row {self.row}" if self.row is not None else "")
        return f"{where}: {self.message}"


def check_seq(trace) -> list:
    out = []
    for rank in trace.ranks:
        seqs, owners, paths = [], [], []
        for fam in FAMILIES:
            for s in sorted((s for s in trace.segments if s.family == fam and s.rank == rank),
                            key=lambda s: s.index):
                v = pq.read_table(s.path, columns=["seq"]).column("seq").to_numpy()
                if len(v) > 1:
                    bad = (v[1:] <= v[:-1]).nonzero()[0]
                    if len(bad):
                        i = int(bad[0]) + 1
                        out.append(Problem("seq", str(s.path), (
                            f"seq {int(v[i])} follows {int(v[i - 1])}: expected strictly increasing "
                            "seq within a segment"), row=i))
                seqs.append(v)
                owners.append(np.full(len(v), len(paths), np.int32))
                paths.append(str(s.path))
        if not seqs:
            continue
        allv, own = np.concatenate(seqs), np.concatenate(owners)
        order = np.argsort(allv, kind="stable")
        sv = allv[order]
        dup = (sv[1:] == sv[:-1]).nonzero()[0]
        if len(dup):
            i = int(dup[0])
            first, second = int(own[order[i]]), int(own[order[i + 1]])
            row = int(order[i + 1] - sum(len(x) for x in seqs[:second]))
            out.append(Problem("seq", paths[second], (
                f"duplicate seq {int(sv[i])} (also in {paths[first]}): expected seq unique per rank "
                f"({len(dup)} duplicated in rank {rank}; a segment copied twice?)"), row=row))
    return out


def check_ranks(trace) -> list:
    """Rank folders vs the manifest's ranks vs rank files."""
    out = []
    declared = set(trace.manifest.get("ranks") or [])
    folders = {s.rank for s in trace.segments}
    mpath = str(trace.path / "manifest.json")
    for r in sorted(folders - declared):
        files = sorted({str(s.path.parent) for s in trace.segments if s.rank == r})
        out.append(Problem("ranks", files[0], (
            f"rank {r} has data but {mpath} lists ranks {sorted(declared)}; expected every rank "
            "folder to be declared in the manifest")))
    rdir = trace.path / _manifest.RANKS_DIR
    if rdir.is_dir():
        for r in sorted(declared):
            if not (rdir / f"rank={r}.json").is_file():
                out.append(Problem("ranks", str(rdir / f"rank={r}.json"), (
                    f"missing: the manifest lists rank {r}; expected its rank file")))
    return out


def rank_info(trace, rank: int):
    """(info dict or None, problem or None) of a rank file."""
    from tracer.schema import SchemaError

    try:
        return _manifest.read_rank_info(trace.path, rank), None
    except SchemaError as e:
        return None, Problem("ranks", str(_manifest.rank_file(trace.path, rank)), str(e).split(": ", 1)[-1])


def check_ranks_accounting(trace) -> list:
    """Rank file events and end state vs the rows on disk, and the seq accounting per rank."""
    out = []
    for rank in trace.ranks:
        info, prob = rank_info(trace, rank)
        if prob:
            out.append(prob)
        rfile = str(_manifest.rank_file(trace.path, rank))
        rows = {f: sum(s.num_rows for s in trace.segments if s.family == f and s.rank == rank)
                for f in FAMILIES}
        if info is not None:
            state = _manifest.end_state(info, _manifest.rank_is_live(trace.path, rank, info))
            if state not in ("complete", "partial"):  # partial: kvtrace inspect shows its coverage
                why = {"recording": "is still recording", "crashed": "crashed (its process died or "
                       "its writes failed" + (f": {info.get('error')}" if info.get("error") else "") + ")",
                       "interrupted": "was interrupted (SIGINT/SIGTERM)",
                       "uncovered": "was not covered by the hooks (no hook installed; its coverage)",
                       "recovered": f"was recovered after it ended {info.get('recovered_from', '?')}"}
                out.append(Problem("state", rfile, (f"rank {rank} {why.get(state, f'ended {state!r}')}; "
                                                    "expected state complete")))
            events = info.get("events")
            if isinstance(events, dict) and state != "recording":
                for fam, n in rows.items():
                    want = events.get(fam)
                    if isinstance(want, int) and want != n:
                        out.append(Problem("count", str(trace.path / fam / f"rank={rank}"), (
                            f"{n} rows on disk but {rfile} recorded {want} {fam} events; expected equal "
                            "(a segment removed, cut short or copied?)")))
        max_seq = _max_seq(trace, rank)
        if info is not None and info.get("state") not in (None, "recording"):
            try:  # the rank file's count of issued seqs also covers a tail cut off the last segment
                max_seq = max(max_seq, int(info.get("issued") or 0))
            except (TypeError, ValueError):
                out.append(Problem("ranks", rfile, f"issued={info.get('issued')!r}; expected an integer"))
        dropped = _dropped(trace, rank)
        gap = max_seq - sum(rows.values()) - dropped
        if gap > 0:
            out.append(Problem("gap", str(trace.path), (
                f"rank {rank}: {gap} events issued (seq up to {max_seq}) are neither on disk nor counted "
                f"in drops; expected seq 1..{max_seq} each written or counted lost")))
        elif gap < 0:
            out.append(Problem("gap", str(trace.path), (
                f"rank {rank}: {-gap} more rows (plus counted losses) than seqs issued (largest seq "
                f"{max_seq}); expected each seq once (duplicated rows?)")))
    return out


def _max_seq(trace, rank: int) -> int:
    best = 0
    for s in trace.segments:
        if s.rank != rank or not s.num_rows:
            continue
        md = pq.ParquetFile(s.path).metadata
        idx = md.schema.to_arrow_schema().get_field_index("seq")
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(idx).statistics
            if st is not None and st.has_min_max:
                best = max(best, int(st.max))
            else:
                best = max(best, int(pq.read_table(s.path, columns=["seq"]).column("seq").to_numpy().max()))
                break
    return best


def _dropped(trace, rank: int) -> int:
    total = 0
    for s in trace.segments:
        if s.family == "drops" and s.rank == rank and s.num_rows:
            total += int(pq.read_table(s.path, columns=["num_events"]).column("num_events").to_numpy().sum())
    return total


def full_check(trace) -> list:
    """Every check above plus the problems found at open and the recorded drops."""
    out = list(trace.problems)
    out += check_seq(trace)
    out += check_ranks(trace)
    out += check_ranks_accounting(trace)
    out += trace._check_drops()
    return out


__all__ = ["full_check", "check_seq", "check_ranks", "check_ranks_accounting", "rank_info", "Path"]
