"""Segment conversion yields between its steps, including while it frees memory."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracer.schema import FAMILIES
from tracer.schema.storage import convert_segment
from tracer.segments import StreamSegment


def _segment(tmp_path, batches: int, rows: int) -> StreamSegment:
    fam = FAMILIES["pool"]
    seg = StreamSegment(tmp_path, fam, 0)
    schema = fam.arrow_schema(stored=False)
    for k in range(batches):
        seq = np.arange(k * rows + 1, (k + 1) * rows + 1, dtype=np.int64)
        cols = {"ts_ns": seq * 10, "seq": seq, "pool": np.zeros(rows, np.uint8), "op": np.ones(rows, np.uint8),
                "rid": seq, "num_slots": np.full(rows, 64, np.int32), "num_pages": np.ones(rows, np.int32),
                "dur_ns": np.zeros(rows, np.int64)}
        arrays = [pa.array(cols[f.name]) if f.name in cols else pa.nulls(rows, f.type) for f in schema]
        seg.write(pa.RecordBatch.from_arrays(arrays, schema=schema))
    os.close(seg.fd)
    return seg


def test_convert_segment_steps_through_frees_and_keeps_every_row(tmp_path):
    seg = _segment(tmp_path, batches=3, rows=1000)
    steps = []
    out = convert_segment(seg.path, seg.fam, row_group_rows=1 << 10, between_steps=lambda: steps.append(1))
    assert not seg.path.exists()
    t = pq.read_table(out)
    assert t.column("seq").to_pylist() == list(range(1, 3001))
    assert t.column("rid").to_pylist() == list(range(1, 3001))
    # read + encode + one per row group (3) + the final rename + one per freed column + the stream
    ncols = len(FAMILIES["pool"].arrow_schema(stored=True))
    assert len(steps) >= 3 + 3 + ncols


def test_convert_empty_segment_removes_the_stream(tmp_path):
    seg = _segment(tmp_path, batches=0, rows=0)
    assert convert_segment(seg.path, seg.fam, between_steps=lambda: None) is None
    assert not seg.path.exists()


def test_a_large_flush_is_written_as_several_messages_with_yields_between(tmp_path):
    """RecordBatch.serialize holds the GIL: a big batch goes out in MESSAGE_ROWS-row messages,
    the recorder's yield between them; the stream reads back as the same rows in order."""
    from tracer import segments

    rows = 2 * segments.MESSAGE_ROWS + 123
    fam = FAMILIES["pool"]
    schema = fam.arrow_schema(stored=False)
    seq = np.arange(1, rows + 1, dtype=np.int64)
    cols = {"ts_ns": seq * 10, "seq": seq, "pool": np.zeros(rows, np.uint8), "op": np.ones(rows, np.uint8),
            "rid": seq, "num_slots": np.full(rows, 64, np.int32), "num_pages": np.ones(rows, np.int32),
            "dur_ns": np.zeros(rows, np.int64)}
    arrays = [pa.array(cols[f.name]) if f.name in cols else pa.nulls(rows, f.type) for f in schema]
    seg = StreamSegment(tmp_path, fam, 0)
    steps = []
    seg.write(pa.RecordBatch.from_arrays(arrays, schema=schema), between_steps=lambda: steps.append(1))
    os.close(seg.fd)
    assert len(steps) == 2 and seg.num_rows == rows
    with pa.OSFile(str(seg.path)) as f:
        reader = pa.ipc.open_stream(f)
        batches = list(reader)
    assert [b.num_rows for b in batches] == [segments.MESSAGE_ROWS] * 2 + [123]
    assert np.array_equal(pa.Table.from_batches(batches).column("seq").to_numpy(), seq)


def test_the_flusher_hands_the_gil_over_with_a_real_nap_once_per_budget(monkeypatch):
    """yield_gil never releases the GIL for a mere instant (a waiting emitter would lose the
    race and wait a whole switch interval): nothing within the budget, a real nap after it."""
    from tracer import buffers

    naps = []
    monkeypatch.setattr(buffers.time, "sleep", lambda s: naps.append(s))
    buffers.start_turn()
    buffers.yield_gil()
    assert naps == []
    buffers._turn[0] -= buffers.HOLD_BUDGET_NS  # the flusher has run a whole budget
    buffers.yield_gil()
    assert naps == [buffers.HANDOFF_NAP_S] and naps[0] > 0
    buffers.yield_gil()  # the budget restarted at the nap
    assert len(naps) == 1
