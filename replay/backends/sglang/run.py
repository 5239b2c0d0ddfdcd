"""One recorded run of the real-code backend: a workload through the real sglang classes with the
tracer hooks on, written as a schema-v1 trace (what ``kvtrace replay`` and ``sweep`` produce).

:func:`record_run` is the backend half of :func:`replay.runs.replay_run` and of
:func:`replay.record.record_workload`: it owns the tracer hooks and the loop; the recorder's
start and stop and the per-request timing the summary needs (arrival, first admission, first
token, finish on the virtual clock) are the lifecycle both backends share
(:func:`replay.backends.base.record_trace`). Everything the real code does reaches the
trace through the hooks; the loop itself writes only the finish rows of requests it refuses
without KV.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from replay.backends.base import RecordedRun, RecordingFailed, RunObserver, record_trace, refuse_existing_trace
from replay.backends.sglang.loop import SglangBackend
from replay.backends.sglang.settings import SglangSettings
from replay.backends.sglang.workload import Workload


class _Observer(RunObserver):
    """The shared run observer over the real ``Req`` objects (string ids), which also writes the
    finish rows no real method writes."""

    key = str

    def batch_of(self, backend: SglangBackend):
        return backend.last_batch.reqs

    def on_finish(self, wreq, req, clock_ns: int, reason: str) -> None:
        if reason in ("too_long", "unschedulable"):
            # Never held KV, so release_kv_cache (whose hook writes finish rows) never runs.
            from tracer.sglang.runtime import requests, state

            requests.emit_finish(req, state.rid_of(req))
        super().on_finish(wreq, req, clock_ns, reason)


def settings_from_knobs(values: dict) -> SglangSettings:
    """The backend's settings from resolved knob values (raises ValueError on a bad combination)."""
    from replay.backends.sglang.settings import from_knobs

    return from_knobs(values)


@contextmanager
def _hooks(detail: str) -> Iterator[dict]:
    """The tracer hooks at ``detail`` for one trace; yields the dict that gets the hook failures.

    Hooks another caller installed are given back at their level afterwards.
    """
    import tracer.sglang
    from tracer.sglang.runtime import state as hook_state

    installed_here = not tracer.sglang.is_installed()
    level_before = tracer.sglang.installed_level()
    tracer.sglang.install(detail=detail)
    # Offline recording: a stats row at every step where anything changed (a server samples
    # at most every 10 ms of wall time), so the trace is complete and deterministic.
    cadence = tracer.sglang.configure()
    tracer.sglang.configure(stats_interval_ms=0)
    hook_state.new_trace()  # request ids and forward_ct are per trace
    failures: dict = {}
    # this trace's failures only: the counters are per process, and hooks another caller
    # installed (not reset by us) may carry counts from earlier recordings
    before = dict(tracer.sglang.failures)
    try:
        yield failures
    finally:
        failures.update({site: n - before.get(site, 0) for site, n in tracer.sglang.failures.items()
                         if n > before.get(site, 0)})
        tracer.sglang.configure(**cadence)
        if installed_here:
            tracer.sglang.uninstall()
        elif tracer.sglang.installed_level() != level_before:
            tracer.sglang.install(detail=level_before)


def record_run(workload: Workload, settings: SglangSettings, out: str | Path, *, detail: str = "counts",
               manifest_extra: dict | None = None, on_progress: Callable[[int, int], None] | None = None,
               flush_interval_ms: int = 1000, check_integrity_every: int = 0, incident: str = "",
               incident_every: int = 7) -> RecordedRun:
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
        incident: plant a bug reproduction of ``replay.backends.sglang.incidents`` ("" = none).
        incident_every: the planted bug fires on every N-th eligible call.
    Returns:
        :class:`RecordedRun` with the applied patches, hook failures, sglang version, the
        bootstrap's ``host_copy_noops`` / ``stubbed`` and the planted incident's counter.
    Raises:
        ValueError: ``out`` already holds a trace, or an unknown incident.
        Interrupted, RecordingFailed: see :func:`replay.backends.base.record_trace` (a
            RecordingFailed's run is filled in as a returned one would be).
    """
    from replay.backends.sglang.env import bootstrap
    from replay.backends.sglang.incidents import apply_incident
    from replay.backends.sglang.patches import PATCHES

    out = Path(out)
    refuse_existing_trace(out)
    info = bootstrap()
    planted: dict = {}

    def run_loop(observer):
        with SglangBackend(workload, settings, observer=observer, debug_memory_pool=False,
                           check_integrity_every=check_integrity_every) as be, \
                apply_incident(incident, incident_every) as counter:
            result = be.run()
        planted.update(counter)
        return result

    failed = None
    with _hooks(detail) as failures:
        try:
            recorded = record_trace(
                workload, out, run_loop, source="sglang-backend",
                server=settings.server(sglang_version=info.sglang_version),
                env=dict(settings.env(), SGLANG_DEBUG_MEMORY_POOL="0"), detail=detail,
                flush_interval_ms=flush_interval_ms, manifest_extra=manifest_extra, on_progress=on_progress,
                observer_cls=_Observer)
        except RecordingFailed as e:
            recorded, failed = e.recorded, e
    recorded.patches = [p.__dict__ for p in PATCHES if getattr(settings, p.setting) == p.value]
    recorded.hook_failures = failures
    recorded.sglang_version = info.sglang_version
    recorded.backend_info = {"host_copy_noops": list(info.noops), "stubbed": list(info.stubbed)}
    recorded.incident = planted if incident else {}
    if failed is not None:
        raise failed
    return recorded


__all__ = ["RecordedRun", "record_run", "settings_from_knobs"]
