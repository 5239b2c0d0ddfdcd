"""One recorded run of the real-code backend: a workload through the real sglang classes with the
tracer hooks on, written as a schema-v1 trace (what ``kvtrace replay`` and ``sweep`` produce).

:func:`record_run` is the backend half of :func:`replay.runs.replay_run`: it owns the tracer
(start, hooks, stop), the loop and the per-request timing the summary needs (arrival, first
admission, first token, finish on the virtual clock). Everything the real code does reaches the
trace through the hooks; the loop itself writes only the finish rows of requests it refuses
without KV.
"""

from __future__ import annotations

from pathlib import Path
from time import perf_counter_ns
from typing import Callable

from replay.backends.base import RecordedRun, RequestTimes, StepRecord
from replay.backends.sglang.loop import SglangBackend
from replay.backends.sglang.settings import SglangSettings
from replay.backends.sglang.workload import Workload


class _Observer:
    """Moves the trace clock with the loop, writes finish rows no real method writes, and notes
    each request's admission, first token and finish on the virtual clock."""

    def __init__(self, on_progress: Callable[[int, int], None] | None) -> None:
        import tracer

        self._set_clock = tracer.set_clock
        self.times: dict[str, RequestTimes] = {}
        self.sched_cpu_ns = 0
        self.on_progress = on_progress
        self.done = 0

    def on_step_begin(self, clock_ns: int) -> None:
        self._set_clock(clock_ns)

    def on_arrival(self, wreq, clock_ns: int) -> None:
        self.times[str(wreq.rid)] = RequestTimes(wreq.arrival_ns)

    def on_finish(self, wreq, req, clock_ns: int, reason: str) -> None:
        if reason in ("too_long", "unschedulable"):
            from tracer.sglang import requests, state

            requests.emit_finish(req, state.rid_of(req))
        t = self.times[str(wreq.rid)]
        t.finish_ns, t.reason = clock_ns, reason
        self.done += 1

    def on_step(self, step: StepRecord, backend: SglangBackend) -> None:
        self.sched_cpu_ns += step.cpu_ns
        if step.mode == "prefill":
            start = step.clock_ns - step.step_ns
            times = self.times
            for req in backend.last_batch.reqs:
                t = times[req.rid]
                if t.scheduled_ns < 0:
                    t.scheduled_ns = start
                if t.first_token_ns < 0 and req.output_ids:
                    t.first_token_ns = step.clock_ns
        if self.on_progress is not None:
            self.on_progress(self.done, step.clock_ns)


def settings_from_knobs(values: dict) -> SglangSettings:
    """The backend's settings from resolved knob values (raises ValueError on a bad combination)."""
    from replay.backends.sglang.settings import from_knobs

    return from_knobs(values)


def record_run(workload: Workload, settings: SglangSettings, out: str | Path, *, detail: str = "counts",
               manifest_extra: dict | None = None, on_progress: Callable[[int, int], None] | None = None,
               flush_interval_ms: int = 1000, check_integrity_every: int = 0) -> RecordedRun:
    """Run ``workload`` through the real classes under ``settings`` and record the trace at ``out``.

    Args:
        workload: arrivals to serve.
        settings: resolved backend settings.
        out: trace directory to create (must not hold a trace).
        detail: capture level: ``steps``, ``counts`` or ``pages`` (docs/capture.md).
        manifest_extra: keys merged into the trace's manifest (e.g. the run's ``kvtrace`` block).
        on_progress: called after every step with (requests completed, virtual clock ns).
        flush_interval_ms: recorder flush interval.
        check_integrity_every: check the occupancy identity every N steps (0 = never).
    Returns:
        :class:`RecordedRun`.
    Raises:
        ValueError: ``out`` already holds a trace.
    """
    from replay.backends.sglang.env import bootstrap
    from replay.backends.sglang.patches import PATCHES

    out = Path(out)
    if (out / "manifest.json").exists():
        raise ValueError(f"{out} already holds a trace; choose a new --out")
    info = bootstrap()

    import tracer
    import tracer.sglang
    from tracer.sglang import state as hook_state

    installed_here = not tracer.sglang.is_installed()
    level_before = tracer.sglang.installed_level()  # hooks another caller installed: restored after
    tracer.sglang.install(detail=detail)
    cadence = tracer.sglang.configure()
    tracer.sglang.configure(stats_interval_ms=0)  # a stats row at every changed step
    hook_state.new_trace()
    t0 = perf_counter_ns()
    rec, ended = None, "crashed"
    try:
        env = dict(settings.env(), SGLANG_DEBUG_MEMORY_POOL="0")
        rec = tracer.start(out, source="sglang-backend", server=settings.server(sglang_version=info.sglang_version),
                           hash_block_tokens=workload.hash_block_tokens, env=env, detail=detail,
                           flush_interval_ms=flush_interval_ms, clock="manual")
        observer = _Observer(on_progress)
        try:
            with SglangBackend(workload, settings, observer=observer, debug_memory_pool=False,
                               check_integrity_every=check_integrity_every) as be:
                result = be.run()
            ended = "complete"
        except KeyboardInterrupt:  # SIGINT (or SIGTERM turned into one by the CLI)
            ended = "interrupted"
            raise
        finally:
            tracer.stop(ended)
    except KeyboardInterrupt as e:
        from replay.errors import Interrupted

        sig = e.args[0] if e.args and str(e.args[0]).startswith("SIG") else "SIGINT"
        raise Interrupted(sig, f"{out}: replay interrupted by {sig}; what was recorded is kept and its "
                               "rank file says interrupted") from None
    finally:
        failures = dict(tracer.sglang.failures)
        tracer.sglang.configure(**cadence)
        if installed_here:
            tracer.sglang.uninstall()
        elif tracer.sglang.installed_level() != level_before:
            tracer.sglang.install(detail=level_before)
    if rec is not None and getattr(rec, "failed", None):
        from replay.errors import DataLostError

        raise DataLostError(f"{out}: the recording failed ({rec.failed}); the events it could not write are "
                            "counted in the drops family and its rank file says crashed")
    wall_ns = perf_counter_ns() - t0
    if manifest_extra:
        from tracer.schema.manifest import update_manifest

        update_manifest(out, lambda m: m.update(manifest_extra))
    applied = [p.__dict__ for p in PATCHES if getattr(settings, p.setting) == p.value]
    times = {int(k): v for k, v in observer.times.items()}
    first = min((w.arrival_ns for w in workload.requests), default=0)
    return RecordedRun(result=result, times=times, sched_cpu_ns=observer.sched_cpu_ns, wall_ns=wall_ns,
                       first_arrival_ns=first, patches=applied, hook_failures=failures,
                       sglang_version=info.sglang_version)


__all__ = ["RecordedRun", "RequestTimes", "record_run", "settings_from_knobs"]
