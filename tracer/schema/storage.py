"""On-disk storage of trace segments: layout, Parquet encoding, IPC stream reading and recovery.

Layout: ``<trace>/<family>/rank=<r>/part-<n>.arrows`` while open (survives truncation: every
completed record batch is recoverable), converted to ``part-<n>.parquet`` when the segment closes
(zstd, DELTA for monotone columns, enums as dictionary strings). ``recover_segment`` converts
what a crash left behind.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from tracer.schema import FAMILIES, Family, enum_names

OPEN_SUFFIX = ".arrows"
CLOSED_SUFFIX = ".parquet"
_PART_RE = re.compile(r"^part-(\d+)\.(arrows|parquet)$")
_DELTA_COLUMNS = {"ts_ns", "seq", "first_seq", "last_seq"}
# The tracer's own Arrow allocations come from the system allocator, not Arrow's default pool:
# mimalloc madvises its arenas for transparent huge pages, and faulting in one 2 MiB page costs
# ~4.5 ms on this VM, with the GIL held when the flusher allocates (see tracer.chunks).
ARROW_POOL = pa.system_memory_pool()


def family_dir(trace_dir: str | os.PathLike, family: str, rank: int) -> Path:
    return Path(trace_dir) / family / f"rank={rank}"


def next_part_index(directory: Path) -> int:
    """One past the highest ``part-<n>`` present (open or closed) in ``directory``."""
    best = -1
    if directory.is_dir():
        for name in os.listdir(directory):
            m = _PART_RE.match(name)
            if m:
                best = max(best, int(m.group(1)))
    return best + 1


def part_name(index: int, suffix: str) -> str:
    return f"part-{index:05d}{suffix}"


# ------------------------------------------------------------------------------------------
# Encoding for storage
# ------------------------------------------------------------------------------------------
def to_stored(table: pa.Table, fam: Family) -> pa.Table:
    """Cast a table with raw uint8 enum codes (or enum strings) to the stored schema.

    Raises ValueError naming the column when a code or name is not a member of its enum.
    """
    arrays = []
    for col in fam.columns:
        if col.name not in table.column_names:
            if pa.types.is_list(col.type) or pa.types.is_string(col.type):
                arrays.append(pa.nulls(table.num_rows, col.type, memory_pool=ARROW_POOL))
                continue
            if col.default is not None:  # a column added in a minor version
                arrays.append(pa.array([col.default] * table.num_rows, col.type))
                continue
            raise ValueError(f"family {fam.name!r}: missing column {col.name!r}")
        chunks = table.column(col.name).chunks  # (ChunkedArray.combine_chunks ignores its pool)
        arr = pa.concat_arrays(chunks, memory_pool=ARROW_POOL) if chunks else table.column(col.name).combine_chunks()
        if col.enum is not None:
            arrays.append(_encode_enum(arr, col.name, col.enum))
        else:
            arrays.append(arr.cast(col.type, memory_pool=ARROW_POOL) if arr.type != col.type else arr)
    return pa.Table.from_arrays(arrays, schema=fam.arrow_schema(stored=True))


def _encode_enum(arr: pa.Array, name: str, enum_type) -> pa.DictionaryArray:
    names = enum_names(enum_type)
    dict_type = pa.dictionary(pa.int8(), pa.string())
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(pa.string(), memory_pool=ARROW_POOL)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        lookup = {n: i for i, n in enumerate(names)}
        values = arr.to_pylist()
        try:
            codes = [lookup[v] for v in values]
        except KeyError as e:
            raise ValueError(f"column {name!r}: {e.args[0]!r} is not one of {names}") from None
        idx = pa.array(codes, pa.int8(), memory_pool=ARROW_POOL)
    else:
        idx = arr.cast(pa.int8(), memory_pool=ARROW_POOL)
        if len(idx) and (pc.min(idx).as_py() < 0 or pc.max(idx).as_py() >= len(names)):
            raise ValueError(f"column {name!r}: code out of range 0..{len(names) - 1} ({names})")
    return pa.DictionaryArray.from_arrays(idx, pa.array(names, pa.string()), memory_pool=ARROW_POOL).cast(
        dict_type, memory_pool=ARROW_POOL)


def _parquet_options(schema: pa.Schema) -> dict:
    dict_cols = [f.name for f in schema if pa.types.is_dictionary(f.type)]
    enc = {f.name: "DELTA_BINARY_PACKED" for f in schema
           if f.name in _DELTA_COLUMNS and pa.types.is_integer(f.type)}
    return {"compression": "zstd", "use_dictionary": dict_cols or False,
            "column_encoding": enc or None, "write_statistics": ["ts_ns", "seq"]}


def write_parquet(path: str | os.PathLike, table: pa.Table, *, row_group_rows: int = 1 << 20,
                  between_row_groups=None) -> int:
    """Write a stored-schema table to ``path`` atomically (tmp + rename). Returns bytes written.

    ``between_row_groups`` (no args) is called after each row group: the recorder passes a
    GIL yield so a compaction never holds the server's thread back for long.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with pq.ParquetWriter(tmp, table.schema, memory_pool=ARROW_POOL, **_parquet_options(table.schema)) as w:
            for start in range(0, max(table.num_rows, 1), row_group_rows):
                w.write_table(table.slice(start, row_group_rows), row_group_size=row_group_rows)
                if between_row_groups is not None:
                    between_row_groups()
        if between_row_groups is not None:
            between_row_groups()
        os.replace(tmp, path)
    except BaseException:  # disk full, ...: never leave a (zero-byte) temporary behind
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
    return path.stat().st_size


def write_family_table(
    trace_dir: str | os.PathLike, family_name: str, table: pa.Table, rank: int = 0, part: int | None = None
) -> Path:
    """Write a whole table of one family as a closed Parquet segment. Returns the file path."""
    fam = FAMILIES[family_name]
    d = family_dir(trace_dir, family_name, rank)
    d.mkdir(parents=True, exist_ok=True)
    if part is None:
        part = next_part_index(d)
    path = d / part_name(part, CLOSED_SUFFIX)
    write_parquet(path, to_stored(table, fam))
    return path


# ------------------------------------------------------------------------------------------
# Open segment: Arrow IPC stream
# ------------------------------------------------------------------------------------------
def read_stream_batches(path: str | os.PathLike) -> tuple[list[pa.RecordBatch], str | None]:
    """Every complete record batch of an IPC stream; second value: why reading stopped early."""
    batches: list[pa.RecordBatch] = []
    try:
        reader = ipc.open_stream(pa.memory_map(str(path)), memory_pool=ARROW_POOL)
    except (pa.ArrowInvalid, OSError) as e:
        return batches, f"unreadable stream header ({e})"
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            return batches, None
        except (pa.ArrowInvalid, OSError) as e:
            return batches, f"torn after {len(batches)} batches ({e})"


UNREADABLE_SUFFIX = ".unreadable"  # bytes of an open segment recovery could not read, kept aside


def convert_segment(path: str | os.PathLike, fam: Family, *, row_group_rows: int = 1 << 20,
                    between_steps=None, keep_unreadable: bool = False) -> Path | None:
    """Convert an IPC stream segment (complete or torn) to Parquet and delete it.

    Returns the Parquet path, or None when the stream held no complete batch (the file is
    removed then too). ``between_steps`` (no args) is called between the conversion's steps.
    ``keep_unreadable``: a stream that is torn or unreadable is renamed to
    ``part-<n>.arrows.unreadable`` instead of deleted (its bytes are kept for inspection).
    If writing the Parquet file fails (disk full) the stream is left untouched and the error raised.
    """
    path = Path(path)
    step = between_steps or (lambda: None)
    batches, note = read_stream_batches(path)
    expected = fam.arrow_schema(stored=False)
    if batches and not batches[0].schema.equals(expected):
        note = (f"foreign stream: columns {batches[0].schema.names} do not match the {fam.name} "
                f"family's {expected.names}")
        batches = []
    rows = sum(b.num_rows for b in batches)
    out = path.with_suffix(CLOSED_SUFFIX)
    if rows:
        table = pa.Table.from_batches(batches, schema=fam.arrow_schema(stored=False))
        step()
        if not _seq_sorted(table.column("seq")):  # batches of concurrent emitters
            table = table.sort_by("seq")
            step()
        table = to_stored(table, fam)
        step()
        write_parquet(out, table, row_group_rows=row_group_rows, between_row_groups=between_steps)
        # Release memory column by column (a large free holds the GIL), then the mapped stream,
        # and only then unlink it (a file's page cache is dropped by the unlink, GIL released).
        columns = table.columns
        del table
        while columns:
            columns.pop()
            step()
    while batches:
        batches.pop()
    step()
    if keep_unreadable and note is not None:
        os.replace(path, path.with_name(path.name + UNREADABLE_SUFFIX))
    else:
        path.unlink()
    return out if rows else None


def _seq_sorted(col: pa.ChunkedArray) -> bool:
    last = None
    for chunk in col.chunks:
        v = chunk.to_numpy()
        if len(v) == 0:
            continue
        if (last is not None and v[0] <= last) or (len(v) > 1 and not (v[1:] > v[:-1]).all()):
            return False
        last = v[-1]
    return True


def recover_segment(path: str | os.PathLike, keep_unreadable: bool = True) -> tuple[int, str | None]:
    """Convert one leftover ``.arrows`` segment; returns (rows recovered, note on the torn tail).

    A torn or unreadable stream is moved aside to ``*.arrows.unreadable`` (``keep_unreadable``).
    Raises SchemaError when the segment is not under a known family folder."""
    from tracer.schema import SchemaError

    path = Path(path)
    fam = FAMILIES.get(path.parent.parent.name)
    if fam is None:
        raise SchemaError(f"{path}: in unknown family folder {path.parent.parent.name!r}; expected one "
                          f"of {', '.join(FAMILIES)}")
    batches, note = read_stream_batches(path)
    expected = fam.arrow_schema(stored=False)
    if batches and not batches[0].schema.equals(expected):
        note, batches = f"foreign stream: columns do not match the {fam.name} family", []
    rows = sum(b.num_rows for b in batches)
    del batches
    convert_segment(path, fam, keep_unreadable=keep_unreadable)
    return rows, note
