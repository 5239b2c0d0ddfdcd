"""Errors raised by the workload package (the CLI turns them into one-line messages)."""

from __future__ import annotations

from replay.errors import KvtraceError


class WorkloadError(KvtraceError, ValueError):
    """A workload could not be generated, read, imported or exported."""


class FormatError(WorkloadError):
    """A malformed line in an imported file: names the file, the line and the field at fault.

    Args:
        path: the file being read.
        line: 1-based line number.
        field: the JSON field at fault ('' when the line itself is not valid JSON).
        problem: what is wrong, e.g. "expected a non-negative integer, got -5".
    """

    def __init__(self, path: str, line: int, field: str, problem: str):
        self.path, self.line, self.field, self.problem = str(path), line, field, problem
        where = f"field {field!r}: " if field else ""
        super().__init__(f"{self.path}:{line}: {where}{problem}")
