"""``kvtrace record``: run a workload through a backend with the tracer hooks installed.

With ``--backend sglang`` the workload runs through the real sglang 0.5.23 scheduler and
memory classes (``replay.backends.sglang``) and the trace is produced by the hooks
(``tracer.sglang``) wrapped around that real code: pool, cache, admission and request rows come
from the real methods. The loop itself writes only the ``abort`` rows of requests it refuses
without ever giving them KV (no real method sees those). Step rows and ``stats`` samples come
from the hooks too: the loop calls the real ``SchedulerPoolStatsObserver.get_pool_stats`` once per
step, after the step's results are processed, and the hooks take that call as the step
boundary (the batch of the step is noted by their ``prepare_for_extend/decode`` hooks).

Next to the trace, ``backend.json`` keeps the resolved settings, the applied patches and the
run's summary.
"""

from __future__ import annotations

import json
from pathlib import Path

BACKENDS = ("sglang",)


class _TraceObserver:
    """Sets the trace clock to the loop's virtual clock at each step and writes the finish rows
    no real method produces (requests refused without KV)."""

    def on_step_begin(self, clock_ns: int) -> None:
        import tracer

        tracer.set_clock(clock_ns)

    def on_arrival(self, wreq, clock_ns: int) -> None:
        return None  # the Req.__init__ hook writes the arrival row

    def on_finish(self, wreq, req, clock_ns: int, reason: str) -> None:
        if reason in ("too_long", "unschedulable"):
            # Never held KV, so release_kv_cache (whose hook writes finish rows) never runs.
            from tracer.sglang import requests, state

            requests.emit_finish(req, state.rid_of(req))

    def on_step(self, step, backend) -> None:
        return None  # the hooks take the loop's per-step get_pool_stats() as the step boundary


def record_workload(workload: str | Path, out: str | Path, *, backend: str = "sglang",
                    overrides: tuple[str, ...] = (), detail: str = "counts", progress: bool = False,
                    flush_interval_ms: int = 1000, check_integrity_every: int = 0,
                    incident: str = "", incident_every: int = 7) -> dict:
    """Record ``workload`` through ``backend`` into the trace directory ``out``.

    Args:
        workload: workload trace directory (``request`` family only).
        out: trace directory to write (must not hold a trace yet).
        backend: only ``sglang``.
        overrides: ``key=value`` settings (see ``replay.backends.sglang.settings``).
        detail: ``counts`` or ``pages`` (pool rows carry page ids).
        progress: show a tqdm bar over completed requests.
        flush_interval_ms: recorder flush interval.
        check_integrity_every: check the occupancy identity every N steps (0 = never).
        incident: plant a bug reproduction of ``replay.backends.sglang.incidents`` ("" = none).
        incident_every: the planted bug fires on every N-th eligible call.
    Returns:
        the ``backend.json`` object: settings, patches, run summary, hook failures, trace path.
    Raises:
        ValueError: unknown backend, bad setting (the message lists the valid keys), or ``out``
            already holds a trace.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    from replay.backends.sglang import SglangBackend, load_workload, parse_overrides
    from replay.backends.sglang.env import bootstrap
    from replay.backends.sglang.patches import PATCHES

    settings = parse_overrides(overrides)
    out = Path(out)
    if (out / "manifest.json").exists():
        raise ValueError(f"{out} already holds a trace; choose a new --out")
    wl = load_workload(workload)
    info = bootstrap()

    import tracer
    import tracer.sglang

    installed_here = not tracer.sglang.is_installed()
    tracer.sglang.install()
    # Offline recording: a stats row at every step where anything changed (a server samples
    # at most every 10 ms of wall time), so the trace is complete and deterministic.
    cadence = tracer.sglang.configure()
    tracer.sglang.configure(stats_interval_ms=0)
    from tracer.sglang import state as hook_state

    hook_state.new_trace()  # request ids and forward_ct are per trace
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(wl.requests), unit="req", desc="record", leave=False, disable=None,
                   mininterval=0.5)
    try:
        env = dict(settings.env(), SGLANG_DEBUG_MEMORY_POOL="0")
        tracer.start(out, source="sglang-backend", server=settings.server(sglang_version=info.sglang_version),
                     hash_block_tokens=wl.hash_block_tokens, env=env, detail=detail,
                     flush_interval_ms=flush_interval_ms, clock="manual")
        from replay.backends.sglang.incidents import apply_incident

        try:
            with SglangBackend(wl, settings, observer=_TraceObserver(), debug_memory_pool=False,
                               check_integrity_every=check_integrity_every) as be, \
                    apply_incident(incident, incident_every) as planted:
                result = be.run(on_progress=bar.update if bar is not None else None)
        finally:
            tracer.stop()
    finally:
        if bar is not None:
            bar.close()
        failures = dict(tracer.sglang.failures)
        tracer.sglang.configure(**cadence)
        if installed_here:
            tracer.sglang.uninstall()
    applied = [p.__dict__ for p in PATCHES if getattr(settings, p.setting) == p.value]
    summary = {"trace": str(out), "workload": str(workload), "backend": backend,
               "sglang_version": info.sglang_version, "settings": settings.to_dict(),
               "patches": applied, "host_copy_noops": list(info.noops), "stubbed": list(info.stubbed),
               "hook_failures": failures, "result": result.__dict__}
    if incident:
        summary["incident"] = {"name": incident, "every": incident_every, **planted}
    (out / "backend.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
