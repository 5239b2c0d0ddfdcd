"""One recorded run of the reference backend (the ``record_run`` contract of
:mod:`replay.backends.sglang.run`): the workload through the reference scheduler on the virtual
clock, emitted through the tracer's API into a schema-v1 trace at ``out``."""

from __future__ import annotations

from pathlib import Path
from time import perf_counter_ns
from typing import Callable

from replay.backends.base import RecordedRun, RequestTimes, StepRecord
from replay.backends.reference.scheduler import ReferenceBackend
from replay.backends.reference.settings import ReferenceSettings, from_knobs


class _Observer:
    """Moves the trace clock with the loop and notes admission, first token and finish times."""

    def __init__(self, on_progress: Callable[[int, int], None] | None) -> None:
        import tracer

        self._tracer = tracer
        self.times: dict[int, RequestTimes] = {}
        self.sched_cpu_ns = 0
        self.on_progress = on_progress
        self.done = 0

    def on_step_begin(self, clock_ns: int) -> None:
        self._tracer.set_clock(clock_ns)

    def on_arrival(self, wreq, clock_ns: int) -> None:
        self.times[int(wreq.rid)] = RequestTimes(wreq.arrival_ns)

    def on_finish(self, wreq, req, clock_ns: int, reason: str) -> None:
        t = self.times[int(wreq.rid)]
        t.finish_ns, t.reason = clock_ns, reason
        self.done += 1

    def on_step(self, step: StepRecord, backend: ReferenceBackend) -> None:
        self.sched_cpu_ns += step.cpu_ns
        if step.mode == "prefill":
            start = step.clock_ns - step.step_ns
            for req in backend.last_batch:
                t = self.times[req.rid]
                if t.scheduled_ns < 0:
                    t.scheduled_ns = start
                if t.first_token_ns < 0 and req.output_ids:
                    t.first_token_ns = step.clock_ns
        if self.on_progress is not None:
            self.on_progress(self.done, step.clock_ns)


def settings_from_knobs(values: dict) -> ReferenceSettings:
    """The backend's settings from resolved knob values (raises ValueError on a bad combination)."""
    return from_knobs(values)


def record_run(workload, settings: ReferenceSettings, out: str | Path, *, detail: str = "counts",
               manifest_extra: dict | None = None, on_progress: Callable[[int, int], None] | None = None,
               flush_interval_ms: int = 1000, check_integrity_every: int = 0) -> RecordedRun:
    """Run ``workload`` through the reference backend under ``settings`` and record the trace at ``out``.

    Args:
        workload: arrivals to serve.
        settings: resolved backend settings.
        out: trace directory to create (must not hold a trace).
        detail: recorder detail (``counts``; the model emits no page ids).
        manifest_extra: keys merged into the trace's manifest (e.g. the run's ``kvtrace`` block).
        on_progress: called after every step with (requests completed, virtual clock ns).
        flush_interval_ms: recorder flush interval.
        check_integrity_every: check the model's integrity every N steps (0 = never).
    Returns:
        :class:`replay.backends.base.RecordedRun`.
    Raises:
        ValueError: ``out`` already holds a trace.
    """
    import tracer

    out = Path(out)
    if (out / "manifest.json").exists():
        raise ValueError(f"{out} already holds a trace; choose a new --out")
    t0 = perf_counter_ns()
    env = {"KVTRACE_BACKEND": "reference", "SGLANG_SWA_EVICTION_INTERVAL": str(settings.swa_eviction_interval_tokens)}
    tracer.start(out, source="reference-backend", server=settings.server(), hash_block_tokens=workload.hash_block_tokens,
                 env=env, detail=detail, flush_interval_ms=flush_interval_ms, clock="manual")
    observer = _Observer(on_progress)
    ok = False
    try:
        with ReferenceBackend(workload, settings, observer=observer,
                              check_integrity_every=check_integrity_every) as be:
            result = be.run()
        ok = True
    finally:
        tracer.stop("complete" if ok else "crashed")
    wall_ns = perf_counter_ns() - t0
    if manifest_extra:
        from tracer.schema.manifest import update_manifest

        update_manifest(out, lambda m: m.update(manifest_extra))
    first = min((w.arrival_ns for w in workload.requests), default=0)
    return RecordedRun(result=result, times=dict(observer.times), sched_cpu_ns=observer.sched_cpu_ns,
                       wall_ns=wall_ns, first_arrival_ns=first)


__all__ = ["record_run", "settings_from_knobs"]
