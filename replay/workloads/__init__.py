"""Workloads: request streams that drive replay (DESIGN.md §3, issue 3).

A workload is a trace directory holding only the ``request`` family (arrival rows with chained
page hashes) and its manifest; any recorded trace is also a valid workload.

- ``generate``: synthetic shapes (multi_turn, agentic, shared_prefix, long_context, mixed).
- ``mooncake`` / ``bailian``: import (and Mooncake export) of public JSONL traces.
- ``io``: write/read workload traces; ``stats``: summary statistics.
- ``cli``: the ``kvtrace workload`` commands; ``make_data``: the committed samples.
"""

from replay.workloads.errors import FormatError, WorkloadError
from replay.workloads.io import RequestColumns, Workload, read_workload, write_workload

__all__ = ["FormatError", "WorkloadError", "RequestColumns", "Workload", "read_workload", "write_workload"]
