"""Workloads: request streams that drive replay (DESIGN.md §3, issue 3).

A workload is a trace directory holding only the ``request`` family (arrival rows with chained
page hashes) and its manifest; any recorded trace is also a valid workload.

- ``generate``: synthetic shapes (multi_turn, agentic, shared_prefix, long_context, mixed).
- ``mooncake`` / ``bailian``: import (and Mooncake export) of public JSONL traces.
- ``model``: the one ``Workload`` (columns + backend request objects); ``io``: the one writer;
  ``read``: any trace's ``request`` family as a workload (through ``replay.trace``);
  ``extract``: ``workload from-trace``; ``stats``: summary statistics.
- ``make_data``: the committed samples.
"""

from replay.workloads.errors import FormatError, WorkloadError
from replay.workloads.io import write_workload
from replay.workloads.model import RequestColumns, Workload, WorkloadRequest
from replay.workloads.read import preload_workload, read_workload

__all__ = ["FormatError", "WorkloadError", "RequestColumns", "Workload", "WorkloadRequest", "preload_workload",
           "read_workload", "write_workload"]
