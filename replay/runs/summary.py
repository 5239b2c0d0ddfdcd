"""A run's figures (``summary.json``): :class:`RunSummary`, how a recorded run becomes one
(``_summarize``: the run trace's metrics, the virtual clock's TTFT and queue times, measured CPU)
and how one is read back; ``RunError``, the error of a run that cannot start.

Its own module so that ``replay.runs.replay`` (the installed sglang and the reference model) and
``replay.runs.code`` (a code's own process) share it without importing each other.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from replay.errors import KvtraceError
from replay.runs.metrics import sink_metrics, trace_metrics

SUMMARY_FILE = "summary.json"
#: figures that are measured CPU (differ between identical replays)
MEASURED = ("host_alloc_cpu_ns", "host_free_cpu_ns", "sched_cpu_ns", "wall_s")


class RunError(KvtraceError, ValueError):
    """A replay that cannot start: bad source, policy, setting, backend or output directory."""


_REFUSED = "with these settings: "


def settings_refused(policy: str, why: object) -> RunError:
    """The error of a run whose settings the backend refuses (a pool too small for its page, ...):
    the same for every try, so a plan or capacity sweep takes that point as infeasible, not as a
    failure to retry (:func:`is_settings_refusal` reads the message back from a sweep's table)."""
    return RunError(f"policy {policy!r} {_REFUSED}{why}")


def is_settings_refusal(error: str) -> bool:
    """Whether a sweep row's ``error`` is a :func:`settings_refused` message."""
    return error.startswith("policy ") and _REFUSED in error


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
    #: why the run ended before serving every request ("" = it did not; ``first_retraction``: the
    #: ``stop_on_retraction`` knob ended it there, so its figures cover the trace up to that step)
    stopped: str = ""
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
    #: False: a figures-only run (``detail="figures"``, :mod:`replay.backends.figures`): these
    #: figures were computed as the replay ran and no trace was written
    traced: bool = True
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


def figures_only(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a finished figures-only run (its ``summary.json`` says ``traced:
    false``; an unreadable or absent summary is not one)."""
    path = Path(run_dir) / SUMMARY_FILE
    try:
        return path.is_file() and json.loads(path.read_text()).get("traced", True) is False
    except (OSError, ValueError, AttributeError):
        return False


def refuse_untraced(out: Path, names: list[str], what: str, sweep: str, unit: str) -> None:
    """Refuse to resume, with traces, the ``sweep`` at ``out`` whose runs ``names`` (``what`` they
    are; each a ``unit``) kept none: resuming would keep them as they are, deleting them would lose
    finished runs."""
    if names:
        raise RunError(f"{out}: the {what} {', '.join(names)} kept no trace in this {sweep} (it ran without "
                       f"--traces); to keep every {unit}'s trace choose a new --out (or --force)")


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


def _summarize(out: Path, rec, run_block: dict) -> RunSummary:
    sink = getattr(rec, "figures", None)  # a figures-only run: no trace to read them from
    figures = trace_metrics(out) if sink is None else sink_metrics(sink)
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
        aborted=res.num_aborted, steps=res.num_steps, stopped=getattr(res, "stopped", ""),
        policy=run_block["policy"], backend=run_block["backend"],
        source=run_block["source"], run=str(out), settings=run_block["settings"], assumed=run_block["assumed"],
        patches=[p["setting"] + "=" + p["value"] for p in rec.patches], traced=sink is None,
    )


def _pct_ms(values: np.ndarray, q: float) -> float:
    return round(float(np.percentile(values, q)) / 1e6, 3) if values.size else 0.0


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write ``obj`` to ``path`` whole or not at all (a temporary file renamed over it; a run's
    ``summary.json``, a recording's ``backend.json``). The temporary file never stays behind (a
    full disk, an interrupt), and a failure to write names ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, indent=1, default=str))
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
