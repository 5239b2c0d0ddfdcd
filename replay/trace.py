"""Trace reader: ``open_trace(path)`` -> manifest, families as DuckDB relations / Polars frames,
and a seq-ordered event iterator per rank.

Problems are reported with the file (and row where it applies) and what was expected:
unknown major schema version (refused), missing/truncated/corrupt segments, duplicate or
out-of-order ``seq``, and recorded drops.
"""

from __future__ import annotations

import heapq
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from replay.errors import KvtraceError
from replay.trace_checks import Problem, full_check
from tracer.schema import FAMILIES, MANIFEST_FILE, SCHEMA_MAJOR, SCHEMA_VERSION, parse_major

_PART_RE = re.compile(r"^part-(\d+)\.(parquet|arrows)$")
_RANK_RE = re.compile(r"^rank=(-?\d+)$")


class TraceError(KvtraceError):
    """A trace that cannot be read as asked; the message names the file and the expectation."""


@dataclass(frozen=True, slots=True)
class Segment:
    family: str
    rank: int
    index: int
    path: Path
    num_rows: int
    num_bytes: int


@dataclass(frozen=True, slots=True)
class Event:
    """One event of the merged stream: ``row`` holds the family's columns (enums as strings)."""

    seq: int
    ts_ns: int
    family: str
    row: dict = field(compare=False)


class Trace:
    """An opened trace directory. Build with :func:`open_trace`."""

    def __init__(self, path: Path, manifest: dict, segments: list[Segment], problems: list[Problem]):
        self.path = path
        self.manifest = manifest
        self.segments = segments
        self.problems = problems
        self._con = None

    # ------------------------------------------------------------------ summary
    @property
    def ranks(self) -> list[int]:
        return sorted({s.rank for s in self.segments} | set(self.manifest.get("ranks") or []))

    def rows(self, family: str) -> int:
        return sum(s.num_rows for s in self.segments if s.family == family)

    def files(self, family: str, rank: int | None = None) -> list[str]:
        _check_family(family)
        return [str(s.path) for s in self.segments
                if s.family == family and (rank is None or s.rank == rank)]

    # ------------------------------------------------------------------ frames
    def table(self, family: str, rank: int | None = None) -> pa.Table:
        """The whole family as one Arrow table with a ``rank`` column (stored schema). Columns
        newer than a file read as their default; ``request`` rows carry whole prompt chains in
        ``page_hashes`` (``tracer.schema.prefixes``: stored prefixes are expanded here)."""
        fam = FAMILIES[_check_family(family)]
        parts = []
        for r in sorted({s.rank for s in self.segments if s.family == family and (rank is None or s.rank == rank)}):
            segs = [s for s in self.segments if s.family == family and s.rank == r]
            t = pa.concat_tables([_read_segment(s.path, fam) for s in segs])
            if family == "request":
                t = self._expand_requests(t, segs, r)
            parts.append(t.append_column("rank", pa.array([r] * t.num_rows, pa.int32())))
        if not parts:
            return fam.arrow_schema(stored=True).append(pa.field("rank", pa.int32())).empty_table()
        return pa.concat_tables(parts)

    def _expand_requests(self, t: pa.Table, segs: list[Segment], rank: int) -> pa.Table:
        from tracer.schema.prefixes import expand_request_table

        salt = _chain_salt(segs)
        try:
            t, lost = expand_request_table(t, salt=salt, rank=rank)
        except ValueError as e:
            raise TraceError(f"{segs[0].path.parent}: {e}") from None
        where = str(segs[0].path.parent)
        for msg in lost:
            p = Problem("prefix", where, msg)
            if p not in self.problems:
                self.problems.append(p)
        return t

    def _needs_table(self, family: str, segs: list[Segment]) -> bool:
        """A family whose files a plain Parquet scan would show differently than ``table``:
        columns missing from older files, or stored request prefixes to expand."""
        fam = FAMILIES[family]
        for s in segs:
            pf = pq.ParquetFile(s.path)
            names = pf.schema_arrow.names
            if any(c.name not in names for c in fam.columns):
                return True
            if family == "request" and _chain_salt([s]) is not None:
                return True  # compacted: block values are synthesized by the reader
            if family == "request" and pf.metadata.num_rows:
                blocks = pf.read(columns=["prefix_blocks"]).column(0)
                if (pa.compute.max(blocks).as_py() or 0) > 0:
                    return True
        return False

    def lazy(self, family: str, rank: int | None = None):
        """Polars LazyFrame of a family (``rank`` from the partition)."""
        import polars as pl

        segs = [s for s in self.segments if s.family == _check_family(family) and (rank is None or s.rank == rank)]
        if not segs or self._needs_table(family, segs):
            return pl.from_arrow(self.table(family, rank)).lazy()
        # rank from the segment list, not from hive parsing of the path: a trace may itself live
        # under ``key=value`` folders (a sweep's ``policy=<p>/``) whose keys are not columns
        by_rank: dict[int, list[str]] = {}
        for s in segs:
            by_rank.setdefault(s.rank, []).append(str(s.path))
        scans = [pl.scan_parquet(files, hive_partitioning=False).with_columns(rank=pl.lit(r, pl.Int32))
                 for r, files in sorted(by_rank.items())]
        return scans[0] if len(scans) == 1 else pl.concat(scans, how="vertical")

    def relation(self, family: str, rank: int | None = None):
        """DuckDB relation of a family (``rank`` from the partition), on this trace's connection."""
        con = self.duckdb()
        files = self.files(family, rank)
        if not files or self._needs_table(family, [s for s in self.segments if str(s.path) in files]):
            return con.from_arrow(self.table(family, rank))
        return con.read_parquet(files, hive_partitioning=True)

    def duckdb(self):
        """This trace's DuckDB connection (created on first use)."""
        if self._con is None:
            import duckdb

            self._con = duckdb.connect()
        return self._con

    # ------------------------------------------------------------------ events
    def events(self, rank: int = 0, families: tuple[str, ...] | None = None,
               batch_rows: int = 65536) -> Iterator[Event]:
        """All events of one rank merged in ``seq`` order (streams file by file)."""
        names = families or tuple(FAMILIES)
        streams = [self._family_stream(f, rank, batch_rows) for f in names]
        return heapq.merge(*streams, key=lambda e: e.seq)

    def _family_stream(self, family: str, rank: int, batch_rows: int) -> Iterator[Event]:
        # Segments are each sorted by seq; with several emitting threads a row can land in the
        # next segment, so merge the segments rather than concatenating them.
        segs = [s for s in self.segments if s.family == family and s.rank == rank]
        if segs and self._needs_table(family, segs):
            rows = self.table(family, rank).drop_columns(["rank"]).sort_by("seq").to_pylist()
            return (Event(r["seq"], r["ts_ns"], family, r) for r in rows)
        return heapq.merge(*(self._segment_stream(s, family, batch_rows) for s in segs),
                           key=lambda e: e.seq)

    @staticmethod
    def _segment_stream(seg: Segment, family: str, batch_rows: int) -> Iterator[Event]:
        for batch in pq.ParquetFile(seg.path).iter_batches(batch_size=batch_rows):
            for row in batch.to_pylist():
                yield Event(row["seq"], row["ts_ns"], family, row)

    # ------------------------------------------------------------------ validation
    def check(self) -> list[Problem]:
        """Every problem of the trace: those found at open (unreadable, missing or open
        segments), seq order and duplicates per rank, rank folders vs manifest vs rank files,
        rows vs the events each rank file recorded, seqs neither written nor counted lost, ranks
        that did not end ``complete``, and recorded drops (see ``replay.trace_checks``)."""
        return full_check(self)

    def _check_seq(self) -> list[Problem]:
        out = []
        for rank in self.ranks:
            seen: dict[int, str] = {}
            for fam in FAMILIES:
                for s in sorted((s for s in self.segments if s.family == fam and s.rank == rank),
                                key=lambda s: s.index):
                    seqs = pq.read_table(s.path, columns=["seq"]).column("seq").to_numpy()
                    if len(seqs) > 1:
                        bad = (seqs[1:] <= seqs[:-1]).nonzero()[0]
                        if len(bad):
                            i = int(bad[0]) + 1
                            out.append(Problem("seq", str(s.path), (
                                f"seq {int(seqs[i])} follows {int(seqs[i - 1])}: expected strictly "
                                f"increasing seq within a segment"), row=i))
                    for i, v in enumerate(seqs.tolist()):
                        other = seen.get(v)
                        if other is not None:
                            out.append(Problem("seq", str(s.path), (
                                f"duplicate seq {v} (also in {other}): expected seq unique per rank"), row=i))
                            break
                        seen[v] = str(s.path)
        return out

    def _check_drops(self) -> list[Problem]:
        out = []
        for s in self.segments:
            if s.family != "drops":
                continue
            for i, r in enumerate(pq.read_table(s.path).to_pylist()):
                out.append(Problem("drops", str(s.path), (
                    f"{r['num_events']} {r['family'] or 'events'} lost ({r['reason']}), "
                    f"seq {r['first_seq']}..{r['last_seq']}" + (f": {r['detail']}" if r["detail"] else "")),
                    row=i))
        return out

    @property
    def num_dropped(self) -> int:
        return int(sum(r for r in self.table("drops").column("num_events").to_pylist()))


def _chain_salt(segs: list[Segment]) -> int | None:
    """The chain salt of a rank's compacted request files (``kvtrace compact``); None: stored as
    hashes. Raises TraceError when the files disagree."""
    from tracer.schema.prefixes import SALT_META

    salts = {(pq.read_schema(s.path).metadata or {}).get(SALT_META) for s in segs}
    if len(salts) > 1:
        raise TraceError(f"{segs[0].path.parent}: request files with different chain salts "
                         f"{sorted(str(x) for x in salts)}; expected one per rank (`kvtrace compact`)")
    salt = salts.pop() if salts else None
    try:
        return None if salt is None else int(salt)
    except ValueError:
        raise TraceError(f"{segs[0].path.parent}: chain salt {salt!r} in the file metadata; expected "
                         "an integer") from None


def _check_family(family: str) -> str:
    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; expected one of {', '.join(FAMILIES)}")
    return family


def open_trace(path: str | os.PathLike, *, strict: bool = True) -> Trace:
    """Open a trace directory.

    Args:
        path: trace directory (holding ``manifest.json``).
        strict: raise TraceError on corrupt, truncated, missing or open segments; when False
            they are skipped and listed in ``trace.problems``.

    Raises:
        TraceError: not a trace, unknown major schema version (always), or (strict) bad segments.
    """
    import json

    root = Path(path)
    mpath = root / MANIFEST_FILE
    if not mpath.is_file():
        raise TraceError(f"{mpath}: missing; expected a kvtrace trace directory with {MANIFEST_FILE}")
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{mpath}: not valid JSON ({e}); expected the trace manifest") from None
    from tracer.schema import SchemaError
    from tracer.schema.manifest import validate_manifest

    try:
        validate_manifest(manifest, str(mpath))
    except SchemaError as e:
        raise TraceError(str(e)) from None
    _check_version(manifest.get("schema_version"), str(mpath))
    segments, problems = _scan(root)
    if strict and problems:
        raise TraceError(_strict_message(root, problems))
    return Trace(root, manifest, segments, problems)


def _strict_message(root: Path, problems: list) -> str:
    """The problems that stop a strict open, one each, but a crash's open segments (one per family
    and rank) as the first and a count: the user needs the one command, not each file."""
    open_segs = [p for p in problems if p.kind == "open_segment"]
    shown = [p for p in problems if p.kind != "open_segment"] + open_segs[:1]
    msg = "; ".join(str(p) for p in shown)
    if len(open_segs) > 1:
        msg += f" (and {len(open_segs) - 1} more open segments: `kvtrace inspect {root}` lists them)"
    return msg


def _check_version(version, where: str) -> None:
    try:
        major = parse_major(version)
    except ValueError as e:
        raise TraceError(f"{where}: {e}") from None
    if major != SCHEMA_MAJOR:
        raise TraceError(f"{where}: schema_version {version} is not supported; this kvtrace reads "
                         f"major version {SCHEMA_MAJOR} (schema {SCHEMA_VERSION})")


def _scan(root: Path) -> tuple[list[Segment], list[Problem]]:
    segments, problems = [], []
    for fam_name, fam in FAMILIES.items():
        fdir = root / fam_name
        if not fdir.is_dir():
            continue
        for rdir in sorted(fdir.iterdir()):
            m = _RANK_RE.match(rdir.name)
            if not rdir.is_dir() or not m:
                continue
            rank = int(m.group(1))
            indices = []
            for f in sorted(rdir.iterdir()):
                pm = _PART_RE.match(f.name)
                if not pm:
                    continue
                idx = int(pm.group(1))
                indices.append(idx)
                if pm.group(2) == "arrows":
                    problems.append(Problem("open_segment", str(f), (
                        "open segment (Arrow IPC stream) of a running recorder or left by a crash; "
                        "expected closed Parquet parts: once the recorder has exited, run "
                        "`kvtrace recover TRACE`")))
                    continue
                seg, prob = _open_segment(f, fam_name, rank, idx)
                if prob:
                    problems.append(prob)
                else:
                    segments.append(seg)
            for gap in sorted(set(range(max(indices, default=-1) + 1)) - set(indices)):
                problems.append(Problem("missing", str(rdir / f"part-{gap:05d}.parquet"), (
                    f"segment missing: expected parts 0..{max(indices)} without gaps")))
    return segments, problems


def _read_segment(path: Path, fam) -> pa.Table:
    """One closed segment in the family's stored schema; a column the file predates (added in a
    minor version) holds its default."""
    t = pq.read_table(path, schema=fam.arrow_schema(stored=True))
    names = pq.read_schema(path).names
    for i, c in enumerate(fam.columns):
        if c.default is not None and c.name not in names:
            t = t.set_column(i, t.schema.field(i), pa.array([c.default] * t.num_rows, c.type))
    return t


def _compatible(got: pa.DataType, want: pa.DataType) -> bool:
    """A stored column readable as ``want``: same kind of integer/float, or a dictionary/string
    enum stored either way."""
    if pa.types.is_dictionary(want):
        return pa.types.is_dictionary(got) or pa.types.is_string(got)
    if pa.types.is_list(want) or pa.types.is_large_list(want):
        return (pa.types.is_list(got) or pa.types.is_large_list(got)) and got.value_type == want.value_type
    if pa.types.is_integer(want):
        return pa.types.is_integer(got) and got.bit_width <= want.bit_width
    if pa.types.is_string(want):
        return pa.types.is_string(got) or pa.types.is_large_string(got)
    return False


def _open_segment(f: Path, fam_name: str, rank: int, idx: int) -> tuple[Segment | None, Problem | None]:
    fam = FAMILIES[fam_name]
    try:
        pf = pq.ParquetFile(f)
    except Exception as e:
        kind = "truncated" if "magic" in str(e).lower() or "footer" in str(e).lower() else "corrupt"
        return None, Problem(kind, str(f), f"unreadable Parquet ({e}); expected a complete Parquet file")
    meta = pf.schema_arrow.metadata or {}
    version = meta.get(b"kvtrace.schema_version", b"").decode() or None
    if version is None:
        return None, Problem("schema", str(f), "no kvtrace.schema_version in file metadata; "
                             "expected a kvtrace segment")
    try:
        _check_version(version, str(f))
    except TraceError as e:
        return None, Problem("version", str(f), str(e).split(": ", 1)[1])
    missing = [c.name for c in fam.columns if c.name not in pf.schema_arrow.names and c.default is None]
    if missing:
        return None, Problem("schema", str(f), f"missing columns {missing}; expected the "
                             f"{fam_name} family columns {fam.column_names}")
    stored = fam.arrow_schema(stored=True)
    for col in stored:
        if col.name not in pf.schema_arrow.names:
            continue  # a column added in a minor version (read as its default)
        got = pf.schema_arrow.field(col.name).type
        if got != col.type and not _compatible(got, col.type):
            return None, Problem("schema", str(f), f"column {col.name!r} has type {got}; expected "
                                 f"{col.type} (the {fam_name} family's stored type)")
    return Segment(fam_name, rank, idx, f, pf.metadata.num_rows, f.stat().st_size), None
