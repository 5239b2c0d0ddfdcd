"""The protocol both replay backends implement, and the records they share.

A backend runs a :class:`replay.workloads.Workload` through a scheduler and memory model on a
virtual clock (``step_fixed_ns + step_per_token_ns * tokens`` per step) and records a schema-v1
trace. Two implement it:

- ``replay.backends.sglang``: the real sglang 0.5.23 classes on CPU, the trace written by the
  tracer hooks wrapped around them;
- ``replay.backends.reference``: the reference scheduler over ``replay.memory``, emitting the same
  trace rows through the tracer's API itself.

Both have one loop shape: at each step the observer's ``on_step_begin(clock)``, arrivals up to
the clock, one batch (prefill admission first, else decode with retraction), the virtual clock
advances, results (finish / checkpoint), one pool sample, ``on_step(record, backend)``.

A backend module (the entry in ``replay.runs.replay.BACKEND_MODULES``) exposes
``settings_from_knobs(values) -> settings`` (a frozen dataclass with ``to_dict()``) and
``record_run(workload, settings, out, *, detail, manifest_extra, on_progress) -> RecordedRun``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

#: Why a request left: ``finished`` (stop token or length), ``retract_oom`` (aborted by the
#: retraction path: out of memory even alone), ``too_long`` (refused at arrival: the prompt does
#: not fit the full pool), ``unschedulable`` (nothing running, nothing arriving, and admission
#: still refuses it).
FINISH_REASONS = ("finished", "retract_oom", "too_long", "unschedulable")


@dataclass(frozen=True)
class StepRecord:
    """One scheduler iteration.

    Attributes:
        forward_ct: step number (0-based).
        mode: 'prefill' | 'decode' | 'idle'.
        batch_size: requests in the batch.
        num_tokens: tokens run (extend tokens or one per decoding request).
        step_ns: virtual duration charged to the step.
        clock_ns: virtual clock after the step.
        num_retracted: requests retracted in this step.
        cpu_ns: host time the step's scheduling code took (measured, never used in decisions).
    """

    forward_ct: int
    mode: str
    batch_size: int
    num_tokens: int
    step_ns: int
    clock_ns: int
    num_retracted: int = 0
    cpu_ns: int = 0


class LoopObserver(Protocol):
    """What a backend loop reports about its own bookkeeping (all methods optional)."""

    def on_arrival(self, wreq: Any, clock_ns: int) -> None: ...

    def on_finish(self, wreq: Any, req: Any, clock_ns: int, reason: str) -> None:
        """``reason``: one of :data:`FINISH_REASONS`."""

    def on_step_begin(self, clock_ns: int) -> None:
        """Called before anything of a step runs, with the virtual clock."""

    def on_step(self, step: StepRecord, backend: Any) -> None: ...


@dataclass
class RunResult:
    """Summary of one run (JSON-friendly)."""

    settings: dict
    num_requests: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    num_retractions: int = 0
    num_steps: int = 0
    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    cached_tokens: int = 0
    clock_ns: int = 0
    final_occupancy: dict = field(default_factory=dict)


@dataclass
class RequestTimes:
    """Virtual-clock times of one request (ns; -1 when it never got there)."""

    arrival_ns: int
    scheduled_ns: int = -1
    first_token_ns: int = -1
    finish_ns: int = -1
    reason: str = ""


@dataclass
class RecordedRun:
    """What a backend's ``record_run`` returns: the loop's result, per-request times, measured CPU."""

    result: RunResult
    times: dict[int, RequestTimes]
    sched_cpu_ns: int
    wall_ns: int
    first_arrival_ns: int
    patches: list[dict] = field(default_factory=list)
    hook_failures: dict = field(default_factory=dict)
    sglang_version: str = ""


class Backend(Protocol):
    """A replay backend instance (a context manager: enter builds the state, exit tears it down)."""

    result: RunResult
    clock_ns: int
    forward_ct: int

    def __enter__(self) -> Backend: ...

    def __exit__(self, *exc) -> None: ...

    @property
    def done(self) -> bool: ...

    def step(self) -> StepRecord:
        """One scheduler iteration; returns its record."""

    def run(self) -> RunResult:
        """Step until every request has finished or been aborted."""

    def check_integrity(self) -> None:
        """Assert the occupancy identity of every pool (raises AssertionError)."""


class BackendModule(Protocol):
    """What ``replay.runs.replay.BACKEND_MODULES`` names: one module per backend."""

    def settings_from_knobs(self, values: dict) -> Any: ...

    def record_run(self, workload: Any, settings: Any, out: str | Path, *, detail: str = "counts",
                   manifest_extra: dict | None = None,
                   on_progress: Callable[[int, int], None] | None = None) -> RecordedRun: ...


__all__ = ["FINISH_REASONS", "Backend", "BackendModule", "LoopObserver", "RecordedRun", "RequestTimes",
           "RunResult", "StepRecord"]
