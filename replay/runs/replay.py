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

import json
import os
import sys
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from replay import knobs
from replay.errors import KvtraceError
from replay.runs.metrics import trace_metrics

SUMMARY_FILE = "summary.json"
#: figures that are measured CPU (differ between identical replays)
MEASURED = ("host_alloc_cpu_ns", "host_free_cpu_ns", "sched_cpu_ns", "wall_s")


class RunError(KvtraceError, ValueError):
    """A replay that cannot start: bad source, policy, setting, backend or output directory."""


@dataclass(frozen=True)
class RunSummary:
    """The figures of one run (``summary.json``); see the module docstring for their sources."""

    requests: int
    finished: int
    peak_full_used: int
    peak_swa_used: int
    mean_swa_used: float
    swa_used_slope_tokens_per_hour: float
    prefix_hit_ratio: float
    host_hit_ratio: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    queue_p99_ms: float
    throughput_tokens_per_s: float
    retractions: int
    swa_evicted_tokens: int
    swa_released_tokens: int
    host_alloc_cpu_ns: int
    host_free_cpu_ns: int
    sched_cpu_ns: int
    sim_s: float
    wall_s: float
    aborted: int = 0
    steps: int = 0
    policy: str = ""
    backend: str = ""
    source: str = ""
    run: str = ""
    settings: dict = field(default_factory=dict)
    assumed: list = field(default_factory=list)
    patches: list = field(default_factory=list)
    #: the code the run ran on (``replay.runs.code``: name, spec, sha, target, ...); empty: installed
    code: dict = field(default_factory=dict)
    #: the ``SGLANG_*``/``KVTRACE_*`` environment given to a code's process (recorded + ``--env``)
    env: dict = field(default_factory=dict)
    #: where the bytes per token came from (``replay.runs.kv_gb.resolve_bytes``: trace/preset/none)
    kv_bytes: dict = field(default_factory=dict)
    #: GB beside tokens (``replay.runs.kv_gb.GB_FIGURES``; None: the pool's bytes are unknown)
    full_pool_gb: float | None = None
    peak_full_used_gb: float | None = None
    mean_full_used_gb: float | None = None
    swa_pool_gb: float | None = None
    peak_swa_used_gb: float | None = None
    mean_swa_used_gb: float | None = None
    host_pool_gb: float | None = None
    peak_host_full_used_gb: float | None = None
    peak_host_swa_used_gb: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunSummary:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def sim_s_per_wall_s(self) -> float:
        return self.sim_s / self.wall_s if self.wall_s > 0 else 0.0


def read_summary(run_dir: str | Path) -> RunSummary:
    """The :class:`RunSummary` of a finished run directory."""
    path = Path(run_dir) / SUMMARY_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunError(f"{path}: missing; expected a finished kvtrace run (kvtrace replay --out)") from None
    except json.JSONDecodeError as e:
        raise RunError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise RunError(f"{path}: expected a JSON object")
    required = [f.name for f in fields(RunSummary) if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in required if k not in data]
    if missing:
        raise RunError(f"{path}: not a kvtrace run summary (missing {', '.join(missing[:5])}"
                       f"{', ...' if len(missing) > 5 else ''}); expected the summary.json of kvtrace replay")
    return RunSummary.from_dict(data)


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
        detail: recorder detail of the run's trace (``counts`` or ``pages``).
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
        raise RunError(f"policy {policy!r} with these settings: {e}") from None
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
    summary = _summarize(out, rec, run_block)
    if code is not None:
        summary = RunSummary.from_dict(summary.to_dict() | {"code": run_block["code"]})
    return _with_gb(out, summary, kv_bytes)


def _kv_bytes(source: Path, model: str | None) -> dict:
    from replay.models import ModelError
    from replay.runs.kv_gb import resolve_bytes

    try:
        return resolve_bytes(source, model)
    except ModelError as e:
        raise RunError(str(e)) from None


def _with_gb(out: Path, summary: RunSummary, kv_bytes: dict) -> RunSummary:
    """``summary`` with the bytes' source and the GB figures (``replay.runs.kv_gb``), written to
    ``out/summary.json``."""
    from replay.runs.kv_gb import gb_figures

    summary = RunSummary.from_dict(summary.to_dict() | {"kv_bytes": kv_bytes}
                                   | gb_figures(out, kv_bytes.get("bytes_per_token") or {}))
    _write_json(out / SUMMARY_FILE, summary.to_dict())
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


def _summarize(out: Path, rec, run_block: dict) -> RunSummary:
    figures = trace_metrics(out)
    res = rec.result
    sim_ns = max(0, res.clock_ns - rec.first_arrival_ns)
    sim_s = sim_ns / 1e9
    done = [t for t in rec.times.values() if t.reason == "finished"]
    ttft = np.array([t.first_token_ns - t.arrival_ns for t in done if t.first_token_ns >= 0], dtype=np.float64)
    queue = np.array([t.scheduled_ns - t.arrival_ns for t in done if t.scheduled_ns >= 0], dtype=np.float64)
    tokens = figures.pop("served_tokens")
    return RunSummary(
        **figures,
        ttft_p50_ms=_pct_ms(ttft, 50), ttft_p99_ms=_pct_ms(ttft, 99), queue_p99_ms=_pct_ms(queue, 99),
        throughput_tokens_per_s=round(tokens / sim_s, 3) if sim_s > 0 else 0.0,
        sched_cpu_ns=int(rec.sched_cpu_ns), sim_s=round(sim_s, 6), wall_s=round(rec.wall_ns / 1e9, 6),
        aborted=res.num_aborted, steps=res.num_steps, policy=run_block["policy"], backend=run_block["backend"],
        source=run_block["source"], run=str(out), settings=run_block["settings"], assumed=run_block["assumed"],
        patches=[p["setting"] + "=" + p["value"] for p in rec.patches],
    )


def _pct_ms(values: np.ndarray, q: float) -> float:
    return round(float(np.percentile(values, q)) / 1e6, 3) if values.size else 0.0


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


class _Progress:
    """tqdm bar over requests done, with the simulated time as postfix (terminal only)."""

    def __init__(self, total: int, first_ns: int, last_ns: int) -> None:
        from tqdm import tqdm

        from replay.console import progress_stream

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
