"""One recorded run of the reference backend (the ``record_run`` contract of
:mod:`replay.backends.base`): the workload through the reference scheduler on the virtual clock,
emitted through the tracer's API into a schema-v1 trace at ``out`` by the shared recording
lifecycle (:func:`replay.backends.base.record_trace`)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from replay.backends.base import RecordedRun, record_trace, refuse_existing_trace
from replay.backends.reference.scheduler import ReferenceBackend
from replay.backends.reference.settings import ReferenceSettings, from_knobs


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
        Interrupted, RecordingFailed: see :func:`replay.backends.base.record_trace`.
    """
    out = Path(out)
    refuse_existing_trace(out)

    def run_loop(observer):
        with ReferenceBackend(workload, settings, observer=observer,
                              check_integrity_every=check_integrity_every) as be:
            return be.run()

    env = {"KVTRACE_BACKEND": "reference", "SGLANG_SWA_EVICTION_INTERVAL": str(settings.swa_eviction_interval_tokens)}
    return record_trace(workload, out, run_loop, source="reference-backend", server=settings.server(), env=env,
                        detail=detail, flush_interval_ms=flush_interval_ms, manifest_extra=manifest_extra,
                        on_progress=on_progress)


__all__ = ["record_run", "settings_from_knobs"]
