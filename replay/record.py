"""``kvtrace record``: run a workload through a backend with the tracer hooks installed.

With ``--backend sglang`` the workload runs through the real sglang 0.5.23 scheduler and
memory classes (``replay.backends.sglang``) and the trace is produced by the hooks
(``tracer.sglang``) wrapped around that real code: pool, cache, admission and request rows come
from the real methods. The loop itself writes only the ``abort`` rows of requests it refuses
without ever giving them KV (no real method sees those). Step rows and ``stats`` samples come
from the hooks too: the loop calls the real ``SchedulerPoolStatsObserver.get_pool_stats`` once per
step, after the step's results are processed, and the hooks take that call as the step
boundary (the batch of the step is noted by their ``prepare_for_extend/decode`` hooks).

With ``--backend reference`` the reference scheduler over ``replay.memory`` emits the same rows
through the tracer's API. Either way the run is the backend's ``record_run``, the one recording
lifecycle ``kvtrace replay`` uses too; this module adds the command-line checks in front of it.
Next to the trace, ``backend.json`` keeps the resolved settings, the applied patches and the
run's summary.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

from replay.errors import DataLostError, KvtraceError
from replay.knobs import BACKENDS


def record_workload(workload: str | Path, out: str | Path, *, backend: str = "sglang",
                    overrides: tuple[str, ...] = (), detail: str = "counts", progress: bool = False,
                    flush_interval_ms: int = 1000, check_integrity_every: int = 0,
                    incident: str = "", incident_every: int = 7, code=None, env=()) -> dict:
    """Record ``workload`` through ``backend`` into the trace directory ``out``.

    The command-line checks (settings, output directory, workload) before the backend's own
    ``record_run`` (``replay.runs.replay.BACKEND_MODULES``, the lifecycle ``kvtrace replay``
    runs too), then ``backend.json`` next to the trace.

    Args:
        workload: workload trace directory (``request`` family only).
        out: trace directory to write (must not hold a trace yet).
        backend: ``sglang`` (the real classes, the trace written by the hooks) or ``reference``
            (the reference scheduler over ``replay.memory``, emitting through the tracer's API).
        overrides: ``key=value`` knobs of :mod:`replay.knobs` over their defaults.
        detail: capture level ``steps``, ``counts`` or ``pages`` (docs/capture.md).
        progress: show a tqdm bar over completed requests.
        flush_interval_ms: recorder flush interval.
        check_integrity_every: check the occupancy identity every N steps (0 = never).
        incident: plant a bug reproduction of ``replay.backends.sglang.incidents`` ("" = none;
            sglang backend only).
        incident_every: the planted bug fires on every N-th eligible call.
        code: record on this code (``SPEC`` or ``NAME=SPEC``, or a resolved
            :class:`replay.runs.code.Code`): in the code's own process, on its target's backend
            (:func:`replay.runs.code.record_code`); None or ``installed``: the installed sglang here.
        env: ``K=V`` strings or a dict for the code's process, over the workload's recorded
            ``SGLANG_*`` switches (with a code only).
    Returns:
        the ``backend.json`` object: settings, patches, run summary, hook failures, trace path.
    Raises:
        KvtraceError: unknown backend, bad setting (the message lists the valid keys), ``out``
            not a new or empty directory, a bad workload, or every request aborted.
        Interrupted: SIGINT (or SIGTERM inside ``signals_as_interrupts``); the trace is kept,
            its rank file says interrupted.
        DataLostError: the recording failed (disk full, ...) or backend.json could not be written.
    """
    from replay import knobs
    from replay.backends.base import RecordingFailed
    from replay.runs.replay import backend_module
    from replay.workloads import read_workload

    if backend not in BACKENDS:
        raise KvtraceError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if code is not None or env:
        from replay.runs.code import one_code

        resolved = one_code(code, env)
        if not resolved.installed:
            return _record_code(workload, Path(out), resolved, backend=backend, overrides=overrides, detail=detail,
                                progress=progress, check_integrity_every=check_integrity_every,
                                incident=incident, env=env)
    if incident and backend != "sglang":
        raise KvtraceError(f"--incident {incident}: bugs are planted in the real sglang classes; "
                           "use --backend sglang")
    impl = backend_module(backend)
    try:
        settings = impl.settings_from_knobs(knobs.defaults() | knobs.parse_sets(overrides))
    except (ValueError, TypeError, OverflowError) as e:
        raise KvtraceError(f"--set: {e}") from None
    out = Path(out)
    check_out_dir(out, "--out")
    _validate_workload(workload)
    try:
        wl = read_workload(workload)
    except (ValueError, OverflowError) as e:
        raise KvtraceError(f"--workload {workload}: {e}") from None
    longest = getattr(wl, "max_seq_tokens", 0)
    if settings.max_context_tokens and longest > settings.max_context_tokens:
        raise KvtraceError(f"--set max_context_tokens={settings.max_context_tokens}: a request row that "
                           f"small cannot hold the workload's longest request ({longest} tokens of prompt "
                           f"+ max_new_tokens); expected >= {longest}, or 0 to size rows from the workload")
    bar = None
    if progress:
        from tqdm import tqdm

        from replay.console import no_progress_monitor, progress_stream

        no_progress_monitor()
        bar = tqdm(total=len(wl.requests), unit="req", desc="record", leave=False, disable=None,
                   mininterval=0.5, file=progress_stream())
    kw = {"incident": incident, "incident_every": incident_every} if incident else {}
    failed = None
    try:
        rec = impl.record_run(wl, settings, out, detail=detail, flush_interval_ms=flush_interval_ms,
                              check_integrity_every=check_integrity_every,
                              on_progress=_bar_update(bar) if bar is not None else None, **kw)
    except RecordingFailed as e:
        rec, failed = e.recorded, e
    finally:
        if bar is not None:
            bar.close()
    summary = {"trace": str(out), "workload": str(workload), "backend": backend,
               "sglang_version": rec.sglang_version, "settings": settings.to_dict(), "patches": rec.patches,
               **rec.backend_info, "hook_failures": rec.hook_failures, "result": rec.result.__dict__,
               "end_state": "crashed" if failed is not None else "complete"}
    if incident:
        summary["incident"] = {"name": incident, "every": incident_every, **rec.incident}
    return _finish(workload, out, summary, failed)


def _finish(workload, out: Path, summary: dict, failed: BaseException | None = None) -> dict:
    """Write ``backend.json``; refuse a recording in which every request was aborted."""
    try:
        from replay.runs.summary import write_json_atomic

        write_json_atomic(out / "backend.json", summary)
    except OSError as e:
        raise DataLostError(f"{out / 'backend.json'}: could not write the run summary ({e.strerror or e})"
                            + ("" if failed is None else f"; the recording failed too: {failed}")) from None
    if failed is not None:
        raise failed
    result = summary["result"]
    if result["num_requests"] and not result["num_finished"]:
        raise KvtraceError(f"--workload {workload}: all {result['num_requests']} requests were aborted "
                           f"({result['num_aborted']} too long or unschedulable with these settings); "
                           "expected pools and limits that can serve at least one request (see "
                           f"{out / 'backend.json'})")
    return summary


def _record_code(workload, out: Path, code, *, backend: str, overrides, detail: str, progress: bool,
                 check_integrity_every: int, incident: str, env) -> dict:
    """``record_workload`` on a code of its own process: the same checks, then
    :func:`replay.runs.code.record_code`, then ``backend.json``."""
    from replay.runs.code import record_code

    refused = [(backend != "sglang", f"--backend {backend}", "a code runs on its target's own backend (fork)"),
               (bool(incident), f"--incident {incident}", "bugs are planted in the installed sglang's classes"),
               (bool(check_integrity_every), f"--check-every {check_integrity_every}",
                "the fork backend does not check the identity while it runs (kvtrace verify checks the trace)")]
    for given, what, why in refused:
        if given:
            raise KvtraceError(f"{what} with --code {code.name}: {why}")
    check_out_dir(out, "--out")
    _validate_workload(workload)
    summary = record_code(workload, out, code, overrides=overrides, env=env, detail=detail, progress=progress)
    return _finish(workload, out, summary)


def _bar_update(bar):
    """``on_progress(done, clock_ns)`` moving a tqdm bar over completed requests."""
    def update(done: int, clock_ns: int) -> None:
        if done != bar.n:
            bar.update(done - bar.n)
    return update


def check_out_dir(out: Path, option: str) -> None:
    """Refuse an output directory that cannot be written or would mix with other files
    (``replay.outdir.check_new_dir``; ``record`` never replaces an existing trace)."""
    from replay.outdir import check_new_dir

    check_new_dir(out, option, force=False)


def _validate_workload(workload) -> None:
    """The shared workload validation (schema version, manifest, columns) before the backend's
    own loader reads it."""
    from replay.trace import open_trace
    from replay.workloads.io import read_workload

    read_workload(workload)
    open_trace(workload, strict=True)  # column types, unreadable or open segments


@contextmanager
def signals_as_interrupts(retry_s: float = 0.0005, give_up_s: float = 5.0):
    """While active (main thread only), SIGINT and SIGTERM raise ``KeyboardInterrupt`` (with
    "SIGTERM" as its argument for SIGTERM), so ``record_workload`` stops the recorder cleanly and
    marks the trace interrupted. A signal that arrives while the recorder's bookkeeping runs (an
    emit between issuing its seq and keeping its row, :func:`tracer.critical.in_recorder`) raises
    only once that has returned: a one-shot ``SIGALRM`` timer looks again every ``retry_s``, and
    raises regardless after ``give_up_s``. SIGINT is taken over only from Python's default handler
    (an ignored one stays ignored)."""
    import signal
    import threading

    from tracer.critical import in_recorder

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list = []  # [(signal name, monotonic time of arrival)] while an interrupt waits

    def interrupt(name: str):
        raise KeyboardInterrupt("SIGTERM") if name == "SIGTERM" else KeyboardInterrupt()

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        if pending:  # one waits already: it raises soon
            return
        if in_recorder(frame):
            pending.append((name, time.monotonic()))
            signal.setitimer(signal.ITIMER_REAL, retry_s)
            return
        interrupt(name)

    def on_alarm(_signum, frame):
        if not pending:
            return
        name, since = pending[0]
        if in_recorder(frame) and time.monotonic() - since < give_up_s:
            signal.setitimer(signal.ITIMER_REAL, retry_s)
            return
        pending.clear()
        interrupt(name)

    handled = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is signal.default_int_handler else [])
    previous = {sig: signal.signal(sig, on_signal) for sig in handled}
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, on_alarm)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:  # arrived in the last bookkeeping: raise it now that the recording has ended
            name = pending[0][0]
            pending.clear()
            interrupt(name)
