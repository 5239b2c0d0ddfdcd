"""``kvtrace plan``: at a fixed device KV budget, which full/SWA split serves a trace best.

The budget ``kv_gb`` (10^9 bytes) buys ``full_pool_tokens`` F and ``swa_pool_tokens`` S at each
``swa_full_tokens_ratio`` r as sglang sizes a hybrid SWA pool from its memory (docs/capacity.md,
"Bytes per token"): ``F = B / (bf + r * bs)``, ``S = r * F`` (both down to whole pages), with
``bf`` / ``bs`` the full and SWA pools' bytes per token (the trace's, or a ``--model`` preset's:
:func:`replay.runs.kv_gb.resolve_bytes`). ``host_gb`` sizes the HiCache host pool the same way.

Each split is one replay (the reference backend by default, in parallel: the sweep machinery,
so a plan is a resumable sweep directory); splits start from the smallest SWA share up,
``jobs`` at a time, the next as soon as one ends (on the reference backend a split's replay ends at its first retraction or abort,
which rules it out: ``stop_infeasible``). Feasible splits finish every request with no retraction and no abort; the
best feasible one for the objective (``hit_ratio``: the highest prefix-hit ratio; ``ttft_p99``:
the lowest TTFT p99) is recommended, with its server arguments. Early stop: once a feasible
split reaches 99 % of the attainable hit ratio (the one-pass LRU curve of the full pool at the
workload's footprint, :func:`replay.analysis.capacity.capacity_curve`: no split can beat it),
the larger SWA shares are not run; nor once the ``DECLINE_STEPS`` splits past the best each did worse
than the one before (an infeasible one counts as worse: the curve has turned down, a heuristic that
assumes the curve does not rise again past there). The rule reads the splits in ratio order
(:class:`_Search`), so where it stops does not depend on ``jobs``. ``confirm`` re-runs the winner and its two neighbours on the
real sglang backend and says whether the reference's figures hold (hit ratio within 0.01, peak
SWA within 2 %); where they part, the plan trusts the real backend: the notes say where and by how
much, and the recommendation (``best``, the server arguments) becomes the real backend's best
feasible confirmed split, its own figures (``reference_best`` keeps the reference's; none feasible
there: nothing is recommended).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable

from replay.backends.base import FIGURES
from replay.runs.summary import (SUMMARY_FILE, RunError, figures_only, is_settings_refusal, read_summary,
                                 refuse_untraced)

GB = 1e9
#: ``swa_full_tokens_ratio`` values tried by default (sglang's default 0.8; DSV4's 0.1)
DEFAULT_RATIOS = (0.02, 0.05, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
OBJECTIVES = ("hit_ratio", "ttft_p99")
#: a feasible split at this share of the attainable hit ratio ends the search
EARLY_STOP_SHARE = 0.99
#: the search also ends once this many splits past the best (larger SWA shares) each did worse than
#: the one before (an infeasible one counts as worse): the curve has turned down
DECLINE_STEPS = 2
#: agreement of ``confirm``: |hit ratio difference| and relative peak SWA difference
HIT_TOLERANCE, PEAK_SWA_TOLERANCE = 0.01, 0.02


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """What a plan was asked (saved with its result)."""

    source: str
    kv_gb: float
    host_gb: float | None = None
    objective: str = "hit_ratio"
    ratios: tuple = DEFAULT_RATIOS
    policy: str = "recorded"
    backend: str = "reference"
    model: str | None = None
    jobs: int = 2
    #: end a split's replay at its first retraction or abort (reference backend; ``stop_on_retraction``)
    stop_infeasible: bool = True
    #: keep each split's trace; False (reference backend): the splits run figures-only
    #: (``detail="figures"``, :mod:`replay.backends.figures`: the same summary, no trace written)
    traces: bool = False


@dataclasses.dataclass
class PlanResult:
    """The splits tried (one row each: sizes, GB, the run's figures, ``feasible``), the recommended
    one, the recorded setting's row (when the trace's ratio was among those tried), the server
    arguments to set, and what ``confirm`` found."""

    config: PlanConfig
    bytes_per_token: dict
    attainable_hit_ratio: float
    rows: list[dict]
    best: dict | None
    recorded_ratio: float | None
    early_stopped: bool
    server_args: list[str]
    confirm: list[dict] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: the reference's recommendation when ``confirm`` replaced it by the real backend's view
    reference_best: dict | None = None
    #: why the search ended early: ``attainable`` (a split reached 99 % of the attainable hit ratio),
    #: ``declining`` (the splits past the best each did worse), ``failed`` (a split's replay failed:
    #: the plan cannot conclude), "" (it did not)
    early_stop_reason: str = ""
    #: the splits whose replay failed (``swa_full_tokens_ratio``, ``error``): a plan with any is
    #: incomplete and recommends nothing (a failed split is unknown, not infeasible)
    failed: list[dict] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def split(kv_gb: float, ratio: float, bytes_per_token: dict, page_size: int) -> tuple[int, int]:
    """(full, SWA) pool tokens the budget buys at ``ratio`` (whole pages, at least one each)."""
    bf, bs = float(bytes_per_token["full"]), float(bytes_per_token["swa"])
    full = int(kv_gb * GB / (bf + ratio * bs)) // page_size * page_size
    swa = int(full * ratio) // page_size * page_size
    return max(full, page_size), max(swa, page_size)


def host_tokens(host_gb: float, ratio: float, bytes_per_token: dict, page_size: int) -> int:
    """Host pool tokens ``host_gb`` buys (its full-token share: the SWA host rows in proportion)."""
    hf = bytes_per_token.get("host_full") or bytes_per_token["full"]
    hs = bytes_per_token.get("host_swa") or 0.0
    return max(page_size, int(host_gb * GB / (hf + ratio * hs)) // page_size * page_size)


def plan(source: str | Path, out: str | Path, *, kv_gb: float, host_gb: float | None = None,
         objective: str = "hit_ratio", ratios=None, policy: str = "recorded", backend: str = "reference",
         model: str | None = None, jobs: int = 2, executor: str = "local", confirm: bool = False,
         early_stop: bool = True, stop_infeasible: bool = True, traces: bool = False,
         progress: bool = False) -> PlanResult:
    """Find the best full/SWA split of ``kv_gb`` for ``source`` (see the module docstring).

    ``stop_infeasible`` (reference backend): a split's replay ends at its first retraction or
    abort (``stop_on_retraction=on``: the replay is the same up to there, so the split is
    infeasible all the same); its row says ``status: stopped`` with ``stopped_at_s`` and no hit or
    TTFT figures (they would cover only part of the trace). Off: every split runs to its end.

    ``traces``: keep each split's trace (``kvtrace report``'s evidence, ``diff``, ``doctor``). Off
    (the default; reference backend): the splits run figures-only, their summaries computed as
    they replay (:mod:`replay.backends.figures`: the same figures as from a trace) and no trace
    written; the report of such a plan is its section alone. A plan resumed with ``traces`` refuses
    splits an earlier run kept no trace of.

    Raises:
        RunError: a bad budget, objective or ratio; no bytes per token (give ``model``); or what
            the sweep refuses (source, policy, backend, ``out`` holding another sweep).
    """
    from replay.runs.kv_gb import resolve_bytes
    from replay.runs.one_pass import OnePassBound
    from replay.runs.sweep import sweep

    source, out = Path(source), Path(out)
    if objective not in OBJECTIVES:
        raise RunError(f"--objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    if not (isinstance(kv_gb, (int, float)) and math.isfinite(kv_gb) and 0 < kv_gb <= 1e5):
        raise RunError(f"--kv-gb {kv_gb}: expected a positive number of GB (at most 100000)")
    if host_gb is not None and not (math.isfinite(host_gb) and 0 < host_gb <= 1e6):
        raise RunError(f"--host-gb {host_gb}: expected a positive number of GB (at most 1000000)")
    ratios = sorted(set(float(r) for r in (ratios or DEFAULT_RATIOS)))
    if not ratios or any(not (0 < r <= 4) for r in ratios):
        raise RunError(f"ratios {ratios}: expected swa_full_tokens_ratio values in (0, 4]")
    from replay.models import ModelError

    try:
        kvb = resolve_bytes(source, model)
    except ModelError as e:
        raise RunError(str(e)) from None
    bpt = kvb.get("bytes_per_token") or {}
    if not bpt.get("full") or not bpt.get("swa"):
        raise RunError(f"{source}: no bytes per token of the full and SWA pools (the trace records none); "
                       "give --model NAME (kvtrace plan --help lists the presets)")
    page = _page_size(source)
    stop_infeasible = bool(stop_infeasible) and backend == "reference"
    traces = bool(traces) or backend != "reference"
    cfg = PlanConfig(str(source), float(kv_gb), host_gb, objective, tuple(ratios), policy, backend, model, jobs,
                     stop_infeasible, traces)
    sets = ["stop_on_retraction=on"] if stop_infeasible else []
    points = []
    for r in ratios:
        f, s = split(kv_gb, r, bpt, page)
        pt = {"swa_full_tokens_ratio": r, "full_pool_tokens": f, "swa_pool_tokens": s}
        if host_gb:
            pt["host_pool_tokens"] = host_tokens(host_gb, r, bpt, page)
        points.append(pt)
    if not stop_infeasible:  # a resumed plan would take a stopped run for the split's whole replay
        cut = [p["swa_full_tokens_ratio"] for p in points if (out / _rel(policy, p) / SUMMARY_FILE).is_file()
               and read_summary(out / _rel(policy, p)).stopped]
        if cut:
            raise RunError(f"{out}: the replays of ratios {', '.join(f'{r:g}' for r in cut)} stopped at their "
                           "first retraction in this plan; to run them to their end choose a new --out "
                           "(or --force)")
    if traces:
        refuse_untraced(out, [f"{p['swa_full_tokens_ratio']:g}" for p in points if figures_only(out / _rel(policy, p))],
                        "splits of ratios", "plan", "split")
    largest = max(p["full_pool_tokens"] for p in points)

    # the one-pass LRU curve at the largest full pool tried (no split's hits exceed it), computed
    # beside the replays (5 s of an hour of traffic, which held back every split) and waited for
    # where the stop rule first reads it; killed if the sweep is stopped
    with OnePassBound(source, largest) as bound:
        search = _Search(out, policy, points, bpt, objective, bound.result, early_stop)
        df = sweep(source, out, policies=[policy], points=points, sets=sets, jobs=jobs, executor=executor,
                   backend=backend, detail="counts" if traces else FIGURES, progress=progress, model=model,
                   stop=search.stop)
        attainable = bound.result()
    errors = {r["run"]: r["error"] for r in df.select("run", "error").to_dicts() if r["error"]}
    rows = [_row(out, policy, pt, bpt, errors) for pt in points[:search.cut]]
    early, why = search.cut < len(points), search.why
    failed = [{"swa_full_tokens_ratio": r["swa_full_tokens_ratio"], "error": r.get("error", "")}
              for r in rows if r["status"] == "failed"]
    best = None if failed else _best(rows, objective)
    recorded = _recorded_ratio(source)
    notes = []
    if failed:
        notes.append(incomplete_message(failed, len(rows)))
    elif best is None:
        notes.append("no split finished every request without retractions or aborts at this budget: "
                     "raise --kv-gb")
    res = PlanResult(cfg, bpt, round(attainable, 6), rows, best, recorded, early,
                     server_args(best, host_gb) if best else [], notes=notes, early_stop_reason=why,
                     failed=failed)
    if confirm and best is not None:
        res.confirm, real_rows = _confirm(source, out, res, policy, jobs, model)
        _trust_real(res, real_rows, objective, host_gb)
    (out / "plan.json").write_text(__import__("json").dumps(res.to_dict(), indent=1, default=str))
    return res


def incomplete_message(failed: list[dict], tried: int) -> str:
    """What a plan with failed splits says: which failed and why, and that re-running resumes."""
    first = failed[0]
    more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
    return (f"{len(failed)} of {tried} splits failed (ratio {first['swa_full_tokens_ratio']:g}: {first['error']}"
            f"{more}): the plan is incomplete and recommends nothing; fix the cause and run the same "
            "command again (it resumes: finished splits are kept, the failed ones run again)")


def server_args(row: dict, host_gb: float | None) -> list[str]:
    """The sglang server arguments of a split."""
    args = ["--swa-full-tokens-ratio", f"{row['swa_full_tokens_ratio']:g}", "--max-total-tokens",
            str(row["full_pool_tokens"])]
    if host_gb:
        args += ["--hicache-size", f"{host_gb:g}"]
    return args


def _rel(policy: str, pt: dict) -> Path:
    from replay.runs.jobs import RunSpec

    return RunSpec(policy, tuple(pt.items())).rel_dir


def _row(out: Path, policy: str, pt: dict, bpt: dict, errors: dict | None = None) -> dict:
    rel = _rel(policy, pt)
    run = out / rel
    row = dict(pt) | {"full_gb": round(pt["full_pool_tokens"] * bpt["full"] / GB, 4),
                      "swa_gb": round(pt["swa_pool_tokens"] * bpt["swa"] / GB, 4), "run": str(run)}
    if not (run / SUMMARY_FILE).is_file():
        error = (errors or {}).get(str(rel).replace("\\", "/"), "no summary")
        # settings the backend refuses (a pool below a page) make the split infeasible, as a retraction
        # does; any other failure leaves it unknown
        return row | {"status": "refused" if is_settings_refusal(error) else "failed", "feasible": False,
                      "error": error}
    s = read_summary(run)
    if s.stopped:  # ended at its first retraction or abort: infeasible; its figures cover a part
        return row | {"status": "stopped", "stopped": s.stopped, "stopped_at_s": s.sim_s, "finished": s.finished,
                      "requests": s.requests, "retractions": s.retractions, "aborted": s.aborted,
                      "peak_swa_used": s.peak_swa_used, "peak_full_used": s.peak_full_used, "feasible": False}
    row |= {"status": "ok", "finished": s.finished, "requests": s.requests, "retractions": s.retractions,
            "aborted": s.aborted, "prefix_hit_ratio": s.prefix_hit_ratio, "host_hit_ratio": s.host_hit_ratio,
            "ttft_p50_ms": s.ttft_p50_ms, "ttft_p99_ms": s.ttft_p99_ms, "peak_swa_used": s.peak_swa_used,
            "mean_swa_used": s.mean_swa_used, "peak_full_used": s.peak_full_used}
    row["feasible"] = s.finished == s.requests and s.retractions == 0 and s.aborted == 0
    return row


class _Search:
    """The early-stop rule over the splits in ratio order, as the sweep's ``stop``: after each run
    ends, the rule is applied to each longer prefix of completed splits in turn, so where the
    search ends depends on the figures only (not on ``jobs`` or on which run ended first). The
    rows past the cut are left out of the plan (their runs, killed or complete, stay for a later
    plan to resume)."""

    def __init__(self, out: Path, policy: str, points: list[dict], bpt: dict, objective: str,
                 attainable: Callable[[], float], enabled: bool) -> None:
        from replay.runs.jobs import RunSpec

        self.out, self.policy, self.points, self.bpt = out, policy, points, bpt
        self.objective, self.attainable, self.enabled = objective, attainable, enabled
        self.keys = [RunSpec(policy, tuple(pt.items())).key for pt in points]
        self.rows: list[dict] = []
        self.cut, self.why = len(points), ""

    def stop(self, results: dict) -> str:
        if not self.enabled or self.why:
            return self.why
        while len(self.rows) < len(self.points) - 1 and self.keys[len(self.rows)] in results:
            k = len(self.rows)
            errors = {key: r.get("error") or "" for key, r in results.items()}
            self.rows.append(_row(self.out, self.policy, self.points[k], self.bpt, errors))
            if self.rows[-1]["status"] == "failed":  # unknown, not infeasible: no conclusion can follow
                self.why, self.cut = "failed", k + 1
                return f"the plan stopped: the replay of ratio {self.points[k]['swa_full_tokens_ratio']:g} failed"
            best = _best(self.rows, self.objective)
            if best is None:
                continue
            if best["prefix_hit_ratio"] >= EARLY_STOP_SHARE * self.attainable():
                self.why = "attainable"
            elif _declined(self.rows, best, self.objective):
                self.why = "declining"
            if self.why:
                self.cut = k + 1
                return f"the plan stopped early ({self.why}) after ratio {self.points[k]['swa_full_tokens_ratio']:g}"
        return ""


def _declined(rows: list[dict], best: dict, objective: str) -> bool:
    """Whether the ``DECLINE_STEPS`` splits right after ``best`` (rows in ratio order) each did
    worse for ``objective`` than the split before them (an infeasible split counts as worse)."""
    i = next(k for k, r in enumerate(rows) if r is best)
    after = rows[i + 1:i + 1 + DECLINE_STEPS]
    if len(after) < DECLINE_STEPS:
        return False
    prev = best  # the last feasible split: each feasible one after it must do worse
    for r in after:
        if not r.get("feasible"):
            continue
        worse = (r["prefix_hit_ratio"] < prev["prefix_hit_ratio"] if objective == "hit_ratio"
                 else r["ttft_p99_ms"] > prev["ttft_p99_ms"])
        if not worse:
            return False
        prev = r
    return True


def _best(rows: list[dict], objective: str) -> dict | None:
    ok = [r for r in rows if r.get("feasible")]
    if not ok:
        return None
    if objective == "hit_ratio":  # ties: the smaller SWA share (more full pool)
        return max(ok, key=lambda r: (r["prefix_hit_ratio"], -r["swa_full_tokens_ratio"]))
    return min(ok, key=lambda r: (r["ttft_p99_ms"], r["swa_full_tokens_ratio"]))


def _page_size(source: Path) -> int:
    from replay.runs.replay import resolve_settings

    values, _ = resolve_settings(source, "recorded", (), "reference")
    return int(values.get("page_size") or 1)


def _recorded_ratio(source: Path) -> float | None:
    from tracer.schema.manifest import read_manifest

    try:
        v = (read_manifest(source).get("server") or {}).get("swa_full_tokens_ratio")
        return float(v) if v not in (None, "") else None
    except Exception:  # noqa: BLE001
        return None


def _confirm(source: Path, out: Path, res: PlanResult, policy: str, jobs: int,
             model: str | None) -> tuple[list[dict], list[dict]]:
    """The winner and its two neighbours again on the real sglang backend: one comparison row each
    (reference vs real figures, ``agrees``) and the real backend's own split rows (those that ran)."""
    from replay.runs.sweep import sweep

    done = [r for r in res.rows if r.get("status") == "ok"]
    i = next(k for k, r in enumerate(done) if r is res.best)
    pick = done[max(0, i - 1): i + 2]
    keys = [k for k in ("swa_full_tokens_ratio", "full_pool_tokens", "swa_pool_tokens", "host_pool_tokens")
            if k in pick[0]]
    pts = [{k: r[k] for k in keys} for r in pick]
    sweep(source, out / "confirm", policies=[policy], points=pts, jobs=jobs, backend="sglang", model=model)
    rows, reals = [], []
    for ref, pt in zip(pick, pts):
        real = _row(out / "confirm", policy, pt, res.bytes_per_token)
        if real.get("status") == "ok":
            reals.append(real | {"backend": "sglang"})
        else:
            rows.append({"swa_full_tokens_ratio": pt["swa_full_tokens_ratio"], "agrees": False,
                         "error": "the real backend's run failed"})
            continue
        d_hit = abs(real["prefix_hit_ratio"] - ref["prefix_hit_ratio"])
        d_peak = abs(real["peak_swa_used"] - ref["peak_swa_used"]) / max(1, ref["peak_swa_used"])
        rows.append({"swa_full_tokens_ratio": pt["swa_full_tokens_ratio"],
                     "reference_hit_ratio": ref["prefix_hit_ratio"], "real_hit_ratio": real["prefix_hit_ratio"],
                     "reference_peak_swa": ref["peak_swa_used"], "real_peak_swa": real["peak_swa_used"],
                     "hit_diff": round(d_hit, 6), "peak_swa_rel_diff": round(d_peak, 6),
                     "real_feasible": real["feasible"],
                     "agrees": d_hit <= HIT_TOLERANCE and d_peak <= PEAK_SWA_TOLERANCE})
    return rows, reals


def _trust_real(res: PlanResult, real_rows: list[dict], objective: str, host_gb: float | None) -> None:
    """Where the real backend parts from the reference at a confirmed split, the recommendation is
    the real backend's: its best feasible confirmed split (its own row: figures from sglang, ``run``
    under ``confirm/``), with its server arguments; none feasible there: no recommendation. The
    reference's recommendation is kept in ``reference_best``; the notes say what changed."""
    parted = [c for c in res.confirm if not c["agrees"]]
    if not parted:
        return
    what = "; ".join(f"ratio {c['swa_full_tokens_ratio']:g}: " + (
        f"hit {c['reference_hit_ratio']:.4f} -> {c['real_hit_ratio']:.4f}, peak SWA "
        f"{c['reference_peak_swa']:,} -> {c['real_peak_swa']:,}" if "real_hit_ratio" in c else c["error"])
        for c in parted)
    res.notes.append(f"the real sglang backend parts from the reference ({what}): the recommendation "
                     "comes from the real backend's runs of the confirmed splits")
    ref_best, real_best = res.best, _best(real_rows, objective)
    res.reference_best, res.best = ref_best, real_best
    if real_best is None:
        res.server_args = []
        res.notes.append("on the real backend no confirmed split finishes every request without retractions "
                         "or aborts: nothing is recommended (raise --kv-gb, or confirm other ratios)")
        return
    res.server_args = server_args(real_best, host_gb)
    r, r0 = real_best["swa_full_tokens_ratio"], ref_best["swa_full_tokens_ratio"]
    if r != r0:
        res.notes.append(f"the real backend's best confirmed split is ratio {r:g} (hit "
                         f"{real_best['prefix_hit_ratio']:.4f}), not the reference's {r0:g}")
    tried = sorted(c["swa_full_tokens_ratio"] for c in res.confirm)
    others = [x["swa_full_tokens_ratio"] for x in res.rows if x.get("status") == "ok"]
    if r != r0 and r in (tried[0], tried[-1]) and (r > min(others) if r == tried[0] else r < max(others)):
        res.notes.append(f"ratio {r:g} is the edge of the confirmed splits: the real backend's optimum may lie "
                         "beyond it, among splits it did not run")


__all__ = ["DEFAULT_RATIOS", "OBJECTIVES", "PlanConfig", "PlanResult", "plan", "server_args", "split"]
