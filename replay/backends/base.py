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
``settings_from_knobs(values) -> settings`` (a :class:`replay.backends.settings.BackendSettings`)
and ``record_run(workload, settings, out, *, detail, manifest_extra, on_progress) -> RecordedRun``.
Both ``record_run`` go through one recording lifecycle, :func:`record_trace` (tracer start, the
loop under a :class:`RunObserver`, stop marked complete / interrupted / crashed, the failed-recording
and interrupt errors, the manifest's extra keys, the :class:`RecordedRun`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Callable, Iterable, Protocol

from replay.errors import DataLostError, Interrupted, signal_of

#: Why a request left: ``finished`` (stop token or length), ``retract_oom`` (aborted by the
#: retraction path: out of memory even alone), ``too_long`` (refused at arrival: the prompt does
#: not fit the full pool), ``unschedulable`` (nothing running, nothing arriving, and admission
#: still refuses it).
FINISH_REASONS = ("finished", "retract_oom", "too_long", "unschedulable")


@dataclass(slots=True)  # not frozen: a frozen init costs ~6x more, once per replayed step
class StepRecord:
    """One scheduler iteration (a value: made once per step, never changed; ``dataclasses.replace``
    gives a changed copy).

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
    #: why the run ended before every request was served ("" = it did not; ``first_retraction``:
    #: ``stop_on_retraction=on`` ended it at its first retraction or abort)
    stopped: str = ""


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
    #: what the backend reports about its environment (sglang: ``host_copy_noops``, ``stubbed``)
    backend_info: dict = field(default_factory=dict)
    #: a planted incident's counter (``calls``, ``planted``); empty when none was planted
    incident: dict = field(default_factory=dict)
    #: a figures-only run's :class:`replay.backends.figures.FigureSink` (``detail="figures"``: no trace)
    figures: Any = None


class RecordingFailed(DataLostError):
    """The recorder failed (disk full, ...) while the loop ran to its end: the trace lost events.

    Attributes:
        recorded: the run's :class:`RecordedRun` (the manifest's extra keys were not written).
    """

    def __init__(self, message: str, recorded: RecordedRun) -> None:
        super().__init__(message)
        self.recorded = recorded


class RunObserver:
    """The :class:`LoopObserver` of a recorded run: moves the trace clock with the loop and notes
    each request's arrival, first admission, first token and finish on the virtual clock.

    Subclasses say how a batch's requests are reached (:meth:`batch_of`) and how the loop's
    request ids key :attr:`times` (:attr:`key`).
    """

    #: turns a workload request's rid into the loop's own request id (the key of :attr:`times`)
    key: Callable[[Any], Any] = int
    #: whether the emits write a trace (False: a figures-only run, whose sink reads no arrival's
    #: page hashes, so a loop may leave out their storage form)
    traced = True
    #: a figures-only run's :class:`replay.backends.figures.FigureSink` (None: traced), whose
    #: samples a loop may append itself (``FigureSink.device_series``)
    figures = None

    def __init__(self, set_clock: Callable[[int], None], on_progress: Callable[[int, int], None] | None) -> None:
        self._set_clock = set_clock
        self.times: dict[Any, RequestTimes] = {}
        self.sched_cpu_ns = 0
        self.on_progress = on_progress
        self.done = 0

    def batch_of(self, backend: Any) -> Iterable:
        """The requests of the backend's last batch (each with ``rid`` and ``output_ids``)."""
        return backend.last_batch

    def on_step_begin(self, clock_ns: int) -> None:
        self._set_clock(clock_ns)

    def on_arrival(self, wreq, clock_ns: int) -> None:
        self.times[self.key(wreq.rid)] = RequestTimes(wreq.arrival_ns)

    def on_finish(self, wreq, req, clock_ns: int, reason: str) -> None:
        t = self.times[self.key(wreq.rid)]
        t.finish_ns, t.reason = clock_ns, reason
        self.done += 1

    def on_step(self, step: StepRecord, backend: Any) -> None:
        self.sched_cpu_ns += step.cpu_ns
        if step.mode == "prefill":
            start = step.clock_ns - step.step_ns
            times = self.times
            for req in self.batch_of(backend):
                t = times[req.rid]
                if t.scheduled_ns < 0:
                    t.scheduled_ns = start
                if t.first_token_ns < 0 and req.output_ids:
                    t.first_token_ns = step.clock_ns
        if self.on_progress is not None:
            self.on_progress(self.done, step.clock_ns)

    def on_decode_steps(self, n: int, cpu_ns: int, clock_ns: int) -> None:
        """``on_step`` of ``n`` consecutive decode steps of a figures-only run in one call (a
        coalesced stretch: no request is scheduled or finishes in them): their CPU, the last
        one's end clock."""
        self.sched_cpu_ns += cpu_ns
        if self.on_progress is not None:
            self.on_progress(self.done, clock_ns)


def refuse_existing_trace(out: Path) -> None:
    """Raise ValueError when ``out`` already holds a trace (a run never writes over one)."""
    if (out / "manifest.json").exists():
        raise ValueError(f"{out} already holds a trace; choose a new --out")


def record_trace(workload: Any, out: str | Path, run_loop: Callable[[RunObserver], RunResult], *,
                 source: str, server: dict, env: dict, detail: str, flush_interval_ms: int,
                 manifest_extra: dict | None, on_progress: Callable[[int, int], None] | None,
                 observer_cls: type[RunObserver] = RunObserver) -> RecordedRun:
    """The recording lifecycle both backends share: start the recorder at ``out`` on the manual
    (virtual) clock, run the loop, stop the recorder, merge ``manifest_extra`` into the manifest.

    Args:
        workload: the workload (``requests``, ``hash_block_tokens``).
        out: trace directory to create.
        run_loop: builds the backend, runs it under the given observer and returns its result.
        source, server, env, detail, flush_interval_ms: the recorder's (``tracer.start``).
        manifest_extra: keys merged into the trace's manifest (e.g. the run's ``kvtrace`` block).
        on_progress: called after every step with (requests completed, virtual clock ns).
        observer_cls: the backend's :class:`RunObserver`.
    Returns:
        :class:`RecordedRun` (``result``, ``times``, ``sched_cpu_ns``, ``wall_ns``,
        ``first_arrival_ns``; the backend fills in the rest).
    Raises:
        Interrupted: SIGINT (or SIGTERM turned into a KeyboardInterrupt by the CLI); the trace is
            kept, its rank file says interrupted.
        RecordingFailed: the recorder failed; its rank file says crashed.
    """
    import tracer

    out = Path(out)
    if detail == FIGURES:
        return _record_figures(workload, out, run_loop, on_progress, observer_cls)
    t0 = perf_counter_ns()
    rec, observer, ended = None, None, "crashed"
    try:
        rec = tracer.start(out, source=source, server=server, hash_block_tokens=workload.hash_block_tokens,
                           env=env, detail=detail, flush_interval_ms=flush_interval_ms, clock="manual")
        observer = observer_cls(tracer.set_clock, on_progress)  # start binds the recorder's set_clock
        try:
            result = run_loop(observer)
            ended = "complete"
        except KeyboardInterrupt:
            ended = "interrupted"
            raise
        finally:
            tracer.stop(ended)
    except KeyboardInterrupt as e:
        raise _interrupted(e, out, observer, workload,
                           "what was recorded is kept and its rank file says interrupted") from None
    recorded = _recorded_run(result, observer, workload, t0)
    if getattr(rec, "failed", None):
        raise RecordingFailed(f"{out}: the recording failed ({rec.failed}); the events it could not write are "
                              "counted in the drops family and its rank file says crashed "
                              "(see `kvtrace inspect --strict`)", recorded)
    if manifest_extra:
        from tracer.schema.manifest import update_manifest

        update_manifest(out, lambda m: m.update(manifest_extra))
    return recorded


#: the ``detail`` of a run that writes no trace, only its summary figures (:mod:`replay.backends.figures`)
FIGURES = "figures"


def _record_figures(workload: Any, out: Path, run_loop: Callable[[RunObserver], RunResult],
                    on_progress: Callable[[int, int], None] | None,
                    observer_cls: type[RunObserver]) -> RecordedRun:
    """:func:`record_trace` without a trace: the tracer's emits go to a
    :class:`replay.backends.figures.FigureSink` (``tracer.route``) for the run's figures; ``out`` is
    created and left for the summary."""
    import tracer

    from replay.backends.figures import FigureSink

    out.mkdir(parents=True, exist_ok=True)
    t0 = perf_counter_ns()
    sink = FigureSink()
    emits = sink.emits()
    observer = observer_cls(emits["set_clock"], on_progress)
    observer.traced = False
    observer.figures = sink
    tracer.route(emits)
    try:
        result = run_loop(observer)
    except KeyboardInterrupt as e:
        raise _interrupted(e, out, observer, workload, "a figures-only run keeps nothing") from None
    finally:
        tracer.route(None)
    return _recorded_run(result, observer, workload, t0, figures=sink)


def _interrupted(e: KeyboardInterrupt, out: Path, observer: RunObserver | None, workload: Any,
                 kept: str) -> Interrupted:
    """The error of a run stopped by ``e`` (SIGINT, or the signal the CLI turned into it)."""
    sig = signal_of(e)
    done = observer.done if observer is not None else 0
    return Interrupted(sig, f"{out}: interrupted by {sig} after {done} of {len(workload.requests)} requests; {kept}")


def _recorded_run(result: RunResult, observer: RunObserver, workload: Any, t0: int, **extra) -> RecordedRun:
    """The loop's result and what ``observer`` noted, the wall time since ``t0``."""
    first = min((w.arrival_ns for w in workload.requests), default=0)
    return RecordedRun(result=result, times={int(k): v for k, v in observer.times.items()},
                       sched_cpu_ns=observer.sched_cpu_ns, wall_ns=perf_counter_ns() - t0, first_arrival_ns=first,
                       **extra)


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


__all__ = ["FINISH_REASONS", "Backend", "BackendModule", "LoopObserver", "RecordedRun", "RecordingFailed",
           "RequestTimes", "RunObserver", "RunResult", "StepRecord", "record_trace", "refuse_existing_trace"]
