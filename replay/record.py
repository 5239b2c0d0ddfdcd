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
import os
from contextlib import contextmanager
from pathlib import Path

from replay.errors import DataLostError, Interrupted, KvtraceError

BACKENDS = ("sglang", "reference")


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
        detail: capture level ``steps``, ``counts`` or ``pages`` (docs/capture.md).
        progress: show a tqdm bar over completed requests.
        flush_interval_ms: recorder flush interval.
        check_integrity_every: check the occupancy identity every N steps (0 = never).
        incident: plant a bug reproduction of ``replay.backends.sglang.incidents`` ("" = none).
        incident_every: the planted bug fires on every N-th eligible call.
    Returns:
        the ``backend.json`` object: settings, patches, run summary, hook failures, trace path.
    Raises:
        KvtraceError: unknown backend, bad setting (the message lists the valid keys), ``out``
            not a new or empty directory, a bad workload, or every request aborted.
        Interrupted: SIGINT (or SIGTERM inside ``signals_as_interrupts``); the trace is kept,
            its rank file says interrupted.
        DataLostError: the recording failed (disk full, ...) or backend.json could not be written.
    """
    if backend not in BACKENDS:
        raise KvtraceError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend == "reference":
        return _record_reference(workload, out, overrides, detail)
    from replay.backends.sglang import SglangBackend, load_workload, parse_overrides
    from replay.backends.sglang.env import bootstrap
    from replay.backends.sglang.patches import PATCHES

    try:
        settings = parse_overrides(overrides)
    except (ValueError, TypeError, OverflowError) as e:
        raise KvtraceError(f"--set: {e}") from None
    _check_settings(settings)
    out = Path(out)
    check_out_dir(out, "--out")
    _validate_workload(workload)
    try:
        wl = load_workload(workload)
    except (ValueError, OverflowError) as e:
        raise KvtraceError(f"--workload {workload}: {e}") from None
    longest = getattr(wl, "max_seq_tokens", 0)
    if settings.max_context_tokens and longest > settings.max_context_tokens:
        raise KvtraceError(f"--set max_context_tokens={settings.max_context_tokens}: a request row that "
                           f"small cannot hold the workload's longest request ({longest} tokens of prompt "
                           f"+ max_new_tokens); expected >= {longest}, or 0 to size rows from the workload")
    info = bootstrap()

    import tracer
    import tracer.sglang

    installed_here = not tracer.sglang.is_installed()
    level_before = tracer.sglang.installed_level()  # hooks another caller installed: restored after
    tracer.sglang.install(detail=detail)
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
    result, rec, ended = None, None, "crashed"
    try:
        env = dict(settings.env(), SGLANG_DEBUG_MEMORY_POOL="0")
        rec = tracer.start(out, source="sglang-backend",
                           server=settings.server(sglang_version=info.sglang_version),
                           hash_block_tokens=wl.hash_block_tokens, env=env, detail=detail,
                           flush_interval_ms=flush_interval_ms, clock="manual")
        from replay.backends.sglang.incidents import apply_incident

        try:
            with SglangBackend(wl, settings, observer=_TraceObserver(), debug_memory_pool=False,
                               check_integrity_every=check_integrity_every) as be, \
                    apply_incident(incident, incident_every) as planted:
                result = be.run(on_progress=bar.update if bar is not None else None)
            ended = "complete"
        except KeyboardInterrupt:  # SIGINT, or SIGTERM through ``signals_as_interrupts``
            ended = "interrupted"
            raise
        finally:
            tracer.stop(ended)
    except KeyboardInterrupt as e:
        sig = e.args[0] if e.args and str(e.args[0]).startswith("SIG") else "SIGINT"
        done = bar.n if bar is not None else None
        raise Interrupted(sig, f"{out}: recording interrupted by {sig}"
                          + (f" after {done} of {len(wl.requests)} requests" if done is not None else "")
                          + "; what was recorded is kept and its rank file says interrupted") from None
    finally:
        if bar is not None:
            bar.close()
        failures = dict(tracer.sglang.failures)
        tracer.sglang.configure(**cadence)
        if installed_here:
            tracer.sglang.uninstall()
        elif tracer.sglang.installed_level() != level_before:
            tracer.sglang.install(detail=level_before)
    applied = [p.__dict__ for p in PATCHES if getattr(settings, p.setting) == p.value]
    summary = {"trace": str(out), "workload": str(workload), "backend": backend,
               "sglang_version": info.sglang_version, "settings": settings.to_dict(),
               "patches": applied, "host_copy_noops": list(info.noops), "stubbed": list(info.stubbed),
               "hook_failures": failures, "result": result.__dict__,
               "end_state": "crashed" if rec is not None and rec.failed else "complete"}
    if incident:
        summary["incident"] = {"name": incident, "every": incident_every, **planted}
    try:
        _write_json_atomic(out / "backend.json", summary)
    except OSError as e:
        raise DataLostError(f"{out / 'backend.json'}: could not write the run summary ({e.strerror or e})"
                            + ("" if rec is None or not rec.failed else f"; the recording failed too: {rec.failed}")
                            ) from None
    if rec is not None and rec.failed:
        raise DataLostError(f"{out}: the recording failed ({rec.failed}); the events it could not write "
                            "are counted in the drops family and its rank file says crashed "
                            "(see `kvtrace inspect --strict`)")
    if result.num_requests and not result.num_finished:
        raise KvtraceError(f"--workload {workload}: all {result.num_requests} requests were aborted "
                           f"({result.num_aborted} too long or unschedulable with these settings); "
                           "expected pools and limits that can serve at least one request (see "
                           f"{out / 'backend.json'})")
    return summary


def _record_reference(workload, out, overrides, detail: str) -> dict:
    """``--backend reference``: the reference scheduler over ``replay.memory``, emitting through the
    tracer's API (``replay.backends.reference``); the same ``backend.json``."""
    from replay import knobs
    from replay.backends.reference.run import record_run
    from replay.backends.reference.settings import from_knobs
    from replay.workloads import read_workload

    try:
        settings = from_knobs(knobs.defaults() | knobs.parse_sets(overrides))
    except (ValueError, TypeError) as e:
        raise KvtraceError(f"--set: {e}") from None
    out = Path(out)
    check_out_dir(out, "--out")
    _validate_workload(workload)
    try:
        wl = read_workload(workload)
    except (ValueError, OverflowError) as e:
        raise KvtraceError(f"--workload {workload}: {e}") from None
    rec = record_run(wl, settings, out, detail=detail)
    summary = {"trace": str(out), "workload": str(workload), "backend": "reference", "sglang_version": "",
               "settings": settings.to_dict(), "patches": [], "hook_failures": {},
               "result": rec.result.__dict__, "end_state": "complete"}
    _write_json_atomic(out / "backend.json", summary)
    return summary


def check_out_dir(out: Path, option: str) -> None:
    """Refuse an output directory that cannot be written or would mix with other files
    (``replay.outdir.check_new_dir``; ``record`` never replaces an existing trace)."""
    from replay.outdir import check_new_dir

    check_new_dir(out, option, force=False)


def _check_settings(settings) -> None:
    if settings.has_swa and settings.sliding_window_tokens > settings.swa_tokens:
        raise KvtraceError(f"--set sliding_window_tokens={settings.sliding_window_tokens}: larger than the "
                           f"SWA pool ({settings.swa_tokens} tokens); expected a window that fits the "
                           "pool (raise swa_pool_tokens / swa_full_tokens_ratio)")


def _validate_workload(workload) -> None:
    """The shared workload validation (schema version, manifest, columns) before the backend's
    own loader reads it."""
    from replay.trace import open_trace
    from replay.workloads.io import read_workload

    read_workload(workload)
    open_trace(workload, strict=True)  # column types, unreadable or open segments


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=1, default=str))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def signals_as_interrupts():
    """While active (main thread only), SIGTERM raises KeyboardInterrupt("SIGTERM") like SIGINT
    does, so ``record_workload`` stops the recorder cleanly and marks the trace interrupted."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, _frame):
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
