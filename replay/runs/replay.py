"""``replay_run``: replay a trace (or workload) under a policy; a run is a trace plus ``summary.json``.

A run directory is a schema-v1 trace written by the tracer hooks on the real code, so every
analysis reads runs and production captures alike. Its manifest holds a ``run`` block (policy,
backend, resolved settings, the settings that were assumed, the source and the applied patches);
``summary.json`` holds the figures of :class:`RunSummary`.

Figures come from three places (``docs/replay.md``):
- the run's trace (see :mod:`replay.runs.metrics`): occupancy, hits, evictions, host allocator
  CPU (measured around the real allocator calls);
- the virtual clock and its step-cost model (``step_fixed_ns + step_per_token_ns * tokens``):
  ``ttft_*``, ``queue_p99_ms``, ``throughput_tokens_per_s`` (prompt plus generated tokens of
  finished requests per simulated second), ``sim_s``;
- measured CPU of this process: ``sched_cpu_ns`` (the loop's scheduling and memory code per
  step, the real classes included) and ``wall_s``. Only these and ``host_*_cpu_ns`` differ between
  two replays of the same inputs.
"""

from __future__ import annotations

from pathlib import Path

from replay import knobs
from replay.backends.base import FIGURES
from replay.runs.summary import (MEASURED, SUMMARY_FILE, RunError, RunSummary, _summarize,  # noqa: F401
                                 write_json_atomic, read_summary, settings_refused)


def resolve_settings(source: str | Path, policy: str, sets=(), backend: str = "sglang"):
    """Resolve ``policy`` + ``sets`` over what ``source``'s manifest records.

    Returns:
        (knob values, assumed knob names).
    Raises:
        RunError: unknown policy/knob/value, or a value ``backend`` cannot express.
    """
    from tracer.schema.manifest import read_manifest

    try:
        manifest = read_manifest(Path(source))
    except Exception as e:
        raise RunError(f"{source}: cannot read its manifest.json ({e}); expected a trace or workload directory") from None
    try:
        from replay.backends.dsv4 import recorded_settings  # DSV4 captures: their stack's facts

        values, assumed = knobs.resolve(policy, sets, recorded_settings(source, manifest))
        knobs.check_backend(values, backend)
    except knobs.KnobError as e:
        raise RunError(str(e)) from None
    return values, assumed


def replay_run(source: str | Path, out: str | Path, *, policy: str = "recorded", sets=(),
               backend: str = "sglang", detail: str = "counts", progress: bool = False,
               code: str | None = None, env=(), model: str | None = None) -> RunSummary:
    """Replay the requests of ``source`` (a trace or workload) under ``policy`` into run ``out``.

    Args:
        source: a trace directory with the ``request`` family (capture, recording, workload, run).
        out: run directory to create (absent or empty).
        policy: a preset of :mod:`replay.knobs` (``kvtrace policies``).
        sets: ``key=value`` strings or a dict of knob values applied over the preset.
        backend: ``sglang`` (the real sglang 0.5.23 classes on CPU).
        detail: recorder detail of the run's trace (``counts`` or ``pages``), or ``figures``: no
            trace, the summary's figures computed as the replay runs (:mod:`replay.backends.figures`;
            the reference backend on the installed code only; the summary says ``traced: false``).
        progress: show a progress bar (simulated time, requests done, ETA) on stderr.
        code: run on this code (``replay.runs.code``: a tarball, a directory holding
            python/sglang or sglang/, ``installed``); None: the installed sglang in-process.
        env: ``K=V`` strings or a dict for the code's process, over the source's recorded
            ``SGLANG_*`` switches (a code other than ``installed`` only).
        model: a model preset (``replay.models``) giving each pool's bytes per token; None: the
            bytes the source records, if any (``replay.runs.kv_gb``). The GB figures follow.
    Returns:
        the run's :class:`RunSummary` (also written to ``out/summary.json``).
    Raises:
        RunError: bad source, policy, setting, backend or output directory.
    """
    source, out = Path(source), Path(out)
    if detail == FIGURES and (backend != "reference" or code is not None or env):
        raise RunError("detail 'figures' (a run's figures without its trace) is the reference backend's, "
                       "on the installed code; record a trace (--detail counts) for this run")
    kv_bytes = _kv_bytes(source, model)
    if code is not None or env:
        from replay.runs import code as code_runs

        resolved = code_runs.one_code(code, env)  # SPEC or NAME=SPEC; --env only with a code of its own
        if not resolved.installed:
            summary = code_runs.replay_code(source, out, resolved, policy=policy, sets=sets, env=env,
                                            detail=detail, progress=progress)
            return _with_gb(out, summary, kv_bytes)
    values, assumed = resolve_settings(source, policy, sets, backend)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunError(f"{out}: exists and is not an empty directory; choose a new --out")
    impl = backend_module(backend)
    try:
        settings = impl.settings_from_knobs(values)
    except ValueError as e:
        raise settings_refused(policy, e) from None
    from replay.workloads import WorkloadError, read_workload

    try:
        wl = read_workload(source)
    except (FileNotFoundError, ValueError, WorkloadError) as e:
        raise RunError(str(e)) from None
    if not wl.requests:
        raise RunError(f"{source}: no arrival rows in the request family; nothing to replay")
    run_block = {"policy": policy, "backend": backend, "source": str(source), "settings": settings.to_dict(),
                 "assumed": assumed, "kv_bytes": kv_bytes}
    if code is not None:
        run_block["code"] = resolved.as_dict()
    bar = _Progress(len(wl.requests), wl.requests[0].arrival_ns, wl.requests[-1].arrival_ns) if progress else None
    try:
        rec = impl.record_run(wl, settings, out, detail=detail, manifest_extra={"run": run_block},
                              on_progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    try:
        if getattr(rec.result, "stopped", "") and rec.figures is None:  # the trace says it ends early on purpose
            from tracer.schema.manifest import update_manifest

            update_manifest(out, lambda m: m.setdefault("run", {}).update(stopped=rec.result.stopped))
        summary = _summarize(out, rec, run_block)
        if code is not None:
            summary = RunSummary.from_dict(summary.to_dict() | {"code": run_block["code"]})
        return _with_gb(out, summary, kv_bytes, rec.figures)
    except KeyboardInterrupt as e:  # after the last step: the trace is whole, its summary is not
        from replay.errors import Interrupted, signal_of

        sig = signal_of(e)
        kept = "the trace is complete" if rec.figures is None else "a figures-only run keeps nothing"
        raise Interrupted(sig, f"{out}: interrupted by {sig} after the replay's last step, while writing its "
                               f"summary: {kept}; its summary.json is not written (replay again with --force)") from None


def _kv_bytes(source: Path, model: str | None) -> dict:
    from replay.models import ModelError
    from replay.runs.kv_gb import resolve_bytes

    try:
        return resolve_bytes(source, model)
    except ModelError as e:
        raise RunError(str(e)) from None


def _with_gb(out: Path, summary: RunSummary, kv_bytes: dict, sink=None) -> RunSummary:
    """``summary`` with the bytes' source and the GB figures (``replay.runs.kv_gb``; of the trace
    at ``out``, or of a figures-only run's ``sink``), written to ``out/summary.json``."""
    from replay.runs.kv_gb import gb_figures, gb_from_usage, pool_usage

    bpt = kv_bytes.get("bytes_per_token") or {}
    gb = gb_figures(out, bpt) if sink is None else gb_from_usage(pool_usage(sink.series()), bpt)
    summary = RunSummary.from_dict(summary.to_dict() | {"kv_bytes": kv_bytes} | gb)
    write_json_atomic(out / SUMMARY_FILE, summary.to_dict())
    return summary


#: backend name -> module implementing ``settings_from_knobs(values)`` and ``record_run(workload,
#: settings, out, *, detail, manifest_extra, on_progress) -> RecordedRun`` (see
#: ``replay.backends.sglang.run``); imported on first use.
BACKEND_MODULES = {"sglang": "replay.backends.sglang.run", "reference": "replay.backends.reference.run"}


def backend_module(backend: str):
    """The module that runs ``backend`` (:data:`BACKEND_MODULES`)."""
    import importlib

    if backend not in BACKEND_MODULES:
        raise RunError(f"backend {backend!r} is not available; available: {', '.join(BACKEND_MODULES)}")
    return importlib.import_module(BACKEND_MODULES[backend])


class _Progress:
    """tqdm bar over requests done, with the simulated time as postfix (terminal only)."""

    def __init__(self, total: int, first_ns: int, last_ns: int) -> None:
        from tqdm import tqdm

        from replay.console import no_progress_monitor, progress_stream

        no_progress_monitor()
        self.bar = tqdm(total=total, unit="req", desc="replay", leave=False, mininterval=0.5,
                        disable=None, file=progress_stream())
        self.first_ns, self.done, self.calls = first_ns, 0, 0

    def update(self, done: int, clock_ns: int) -> None:
        self.calls += 1
        if done != self.done:
            self.bar.update(done - self.done)
            self.done = done
        if self.calls % 512 == 0:
            self.bar.set_postfix_str(f"sim {(clock_ns - self.first_ns) / 1e9:,.0f} s", refresh=False)

    def close(self) -> None:
        self.bar.close()


__all__ = ["MEASURED", "RunError", "RunSummary", "SUMMARY_FILE", "read_summary", "replay_run",
           "resolve_settings"]
