"""``kvtrace workload from-trace``: a trace's arrivals as a workload directory.

Any trace with the ``request`` family (a capture from a server, a ``kvtrace record`` run, a
workload) is read by :func:`replay.workloads.read.read_workload` (the defaults it applies to a
capture are listed there) and written back by the one workload writer. The hash chains are
copied, not recomputed, so the workload keeps the trace's ``page_hash`` name and
``hash_block_tokens``; the trace's ``server`` config is kept too (the ``recorded`` policy).
For a recorded run the result equals the workload that was recorded (the backend declares each
request's workload row to the hooks, see ``replay.backends.sglang.tokens``).
"""

from __future__ import annotations

import os
from pathlib import Path

from replay.workloads.errors import WorkloadError
from replay.workloads.io import write_workload
from replay.workloads.model import RequestColumns
from replay.workloads.read import read_workload


def extract_workload(trace: str | os.PathLike, out: str | os.PathLike, *, rank: int | None = None,
                     overwrite: bool = False) -> Path:
    """Write the arrival rows of ``trace`` (one rank) as the workload directory ``out``.

    Args:
        trace: trace directory with the ``request`` family.
        out: workload directory to create (atomically).
        rank: which rank's requests (default: the lowest present).
        overwrite: replace an existing ``out``.

    Returns:
        ``out``. Its manifest's ``workload`` key says where it came from::

            {"source": "trace", "trace": <path>, "rank": r, "producer": <trace producer source>,
             "assumed": [defaults applied, e.g. "output_len<-finish"]}

    Raises:
        WorkloadError: what ``read_workload`` refuses; ``out`` is ``trace`` or exists (without
            ``overwrite``).
    """
    src, dst = Path(trace), Path(out)
    if dst.resolve() == src.resolve():
        raise WorkloadError(f"{dst}: --out is the trace itself; expected a new directory")
    w = read_workload(src, rank)
    c = w.columns
    # rows are renumbered 0..N-1 in arrival order; the trace's request ids stay in rid_str
    cols = RequestColumns(c.ts_ns, c.session_id, c.turn, c.input_len, c.output_len, c.max_new_tokens,
                          c.page_hashes, c.hash_offsets, rid_str=c.rid_str)
    producer = (w.manifest.get("producer") or {}).get("source", "")
    info = {"source": "trace", "trace": str(src), "rank": w.rank, "producer": producer,
            "assumed": list(w.assumed)}
    return write_workload(dst, cols, w.hash_block_tokens, info, overwrite=overwrite,
                          page_hash=w.page_hash, server=w.manifest.get("server") or {})
