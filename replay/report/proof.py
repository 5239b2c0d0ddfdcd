"""The replayed proof of a diagnosis: the same trace's requests replayed under the recorded settings
and under the doctor's recommended ``--set`` knobs, side by side with the trace as recorded.

``replayed_proof(trace, diagnosis, workdir)`` returns a :class:`Proof` whose ``columns`` are

1. ``recorded``: the trace itself (figures of :func:`replay.runs.metrics.trace_metrics`; TTFT
   only when the trace is a run with ``summary.json``: a recording has no first-token rows);
2. ``replay, recorded settings``: :func:`replay.runs.replay.replay_run` of the trace under
   ``policy=recorded`` (the settings of its ``backend.json`` when it has one), the control: it
   tells whether the settings alone reproduce what was recorded (a planted or real code bug does
   not replay);
3. ``replay, recommended``: the same plus the recommendation's ``--set`` knobs (left out when no
   knob addresses the cause, e.g. a lost free or a lost unlock: the fix is code).

Each replay is diagnosed again (``doctor``), so the table carries its verdict per pool. Replays
run on the ``reference`` backend by default (sub-second on the bundled incidents); ``sglang``
runs the real classes. ``SGLANG_*`` switches a recommendation names have no knob to replay with;
the proof says so (``kvtrace doctor --replay`` sets them around real-sglang recordings).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

#: figures of the proof table, in order (keys of RunSummary / trace_metrics)
PROOF_METRICS = ("peak_swa_used", "mean_swa_used", "swa_used_slope_tokens_per_hour", "prefix_hit_ratio",
                 "ttft_p50_ms", "ttft_p99_ms", "retractions")


@dataclass
class ProofColumn:
    label: str
    path: str
    kind: str  # "trace" | "replay" | "run"
    metrics: dict
    verdict: str | None = None
    growth: dict = field(default_factory=dict)  # pool -> verdict
    sets: list = field(default_factory=list)


@dataclass
class Proof:
    columns: list[ProofColumn]
    backend: str
    fix_sets: list
    fix_env: dict
    conclusion: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"backend": self.backend, "fix_sets": self.fix_sets, "fix_env": self.fix_env,
                "conclusion": self.conclusion, "notes": self.notes,
                "columns": [c.__dict__ for c in self.columns]}


def recorded_sets(trace_path: Path) -> list[str]:
    """``key=value`` settings of the trace's ``backend.json`` (a kvtrace recording), else []
    (``policy=recorded`` then reads the manifest's ``server`` block)."""
    from replay import knobs

    bj = Path(trace_path) / "backend.json"
    if not bj.is_file():
        return []
    try:
        settings = json.loads(bj.read_text()).get("settings") or {}
    except (json.JSONDecodeError, AttributeError):
        return []
    return [f"{k}={v}" for k, v in settings.items() if k in knobs.KNOB_BY_NAME]


def diagnosis_of(path) -> tuple[str | None, dict]:
    """(verdict, {pool: verdict}) of ``doctor`` on ``path``; (None, {}) when it cannot diagnose."""
    from replay.diagnosis.doctor import doctor

    try:
        d = doctor(path)
    except Exception:  # noqa: BLE001  (no stats rows, ...: the column simply has no verdict)
        return None, {}
    growth = {p: g["verdict"] for p, g in d.growth.items()}
    for v in d.identity_violations:
        growth[v["pool"]] = "leak"
    return d.verdict, growth


def trace_column(path, label: str = "recorded (this trace)", verdict=None, growth=None) -> ProofColumn:
    from replay.runs.metrics import trace_metrics
    from replay.runs.replay import SUMMARY_FILE

    path = Path(path)
    if (path / SUMMARY_FILE).is_file():
        m = json.loads((path / SUMMARY_FILE).read_text())
        kind = "run"
    else:
        m = trace_metrics(path)
        kind = "trace"
    if verdict is None:
        verdict, growth = diagnosis_of(path)
    return ProofColumn(label, str(path), kind, {k: m.get(k) for k in PROOF_METRICS}, verdict, growth or {})


def _replay_column(trace, out: Path, label: str, sets: list[str], backend: str) -> ProofColumn:
    from replay.runs.replay import replay_run

    s = replay_run(trace, out, policy="recorded", sets=tuple(sets), backend=backend)
    verdict, growth = diagnosis_of(out)
    m = s.to_dict()
    return ProofColumn(label, str(out), "replay", {k: m.get(k) for k in PROOF_METRICS}, verdict, growth, list(sets))


def replayed_proof(trace, diagnosis, workdir, *, backend: str = "reference") -> Proof:
    """Replay ``trace`` under its recorded settings and under ``diagnosis``'s recommendations
    (a :class:`replay.diagnosis.doctor.DoctorReport`) into ``workdir``; see the module docstring.

    Raises:
        replay.runs.replay.RunError: the trace cannot be replayed (no arrival rows, bad settings).
    """
    trace, workdir = Path(trace), Path(workdir)
    recs = diagnosis.recommendations
    fix_sets = list(dict.fromkeys(s for r in recs for s in r.get("sets", [])))
    fix_env = {k: v for r in recs for k, v in (r.get("env") or {}).items()}
    known = getattr(diagnosis, "recorded_knobs", None)
    base = [f"{k}={v}" for k, v in known.items()] if known else recorded_sets(trace)
    growth = {p: g["verdict"] for p, g in diagnosis.growth.items()}
    for v in diagnosis.identity_violations:
        growth[v["pool"]] = "leak"
    cols = [trace_column(trace, verdict=diagnosis.verdict, growth=growth)]
    notes = []
    control = _replay_column(trace, workdir / "recorded", "replay, recorded settings", base, backend)
    cols.append(control)
    if fix_sets:
        cols.append(_replay_column(trace, workdir / "recommended", "replay, recommended", base + fix_sets, backend))
    if fix_env:
        notes.append(" ".join(f"{k}={v}" for k, v in fix_env.items()) + " is an SGLANG_* switch with no replay "
                     "knob; `kvtrace doctor --replay` sets it around real-sglang recordings.")
    rec, after = cols[0], cols[-1]
    cause = diagnosis.primary_cause
    if not diagnosis.causes and rec.verdict in (None, "stable"):
        conclusion = "Nothing to fix: the trace is stable; the replay of its requests is shown for reference."
    elif fix_sets:
        gone = after.verdict == "stable" and rec.verdict != "stable"
        conclusion = (f"{rec.verdict} as recorded, {control.verdict} replayed as recorded, {after.verdict} with "
                      f"{' '.join('--set ' + s for s in fix_sets)}; {_deltas(control, after)}"
                      + (": the problem disappears." if gone else
                         ": the problem remains." if after.verdict not in (None, "stable") else "."))
    elif fix_env:
        conclusion = (f"The fix for {cause} is the switch {' '.join(f'{k}={v}' for k, v in fix_env.items())}, "
                      f"which the {backend} backend has no knob for: the replay shows the recorded settings only "
                      "(kvtrace doctor --replay replays it on real sglang with the switch set).")
    elif control.verdict == "stable" and rec.verdict not in (None, "stable"):
        conclusion = (f"No knob addresses {cause}: the fix is in the server's code. Replayed under the recorded "
                      f"settings without that bug, the same requests are stable: the {rec.verdict} pool is the "
                      "bug's doing, not the settings'.")
    else:
        conclusion = (f"No knob addresses {cause or 'what was found'}; the replay under the recorded settings is "
                      f"{control.verdict} ({_deltas(rec, control)}).")
    return Proof(cols, backend, fix_sets, fix_env, conclusion, notes)


def _deltas(a: ProofColumn, b: ProofColumn) -> str:
    """``mean SWA used 775 -> 310 slots (-60 %), ...`` between two columns."""
    out = []
    for key, name, unit in (("mean_swa_used", "mean SWA used", " slots"), ("peak_swa_used", "peak SWA used", " slots"),
                            ("prefix_hit_ratio", "prefix-hit ratio", "")):
        x, y = a.metrics.get(key), b.metrics.get(key)
        if x is None or y is None:
            continue
        pct = f" ({100 * (y - x) / x:+.0f} %)" if x else ""
        fmt = "{:,.0f}" if unit else "{:.3f}"
        out.append(f"{name} {fmt.format(x)} → {fmt.format(y)}{unit}{pct}")
    return ", ".join(out)


def runs_proof(primary: ProofColumn | None, runs: list[Path], root: Path, known: dict | None = None) -> Proof:
    """The proof of a sweep: the primary trace (if any) beside each run of the sweep; ``known``:
    ``{run path: (verdict, {pool: verdict})}`` already computed."""
    known = known or {}
    cols = [primary] if primary is not None else []
    for r in runs:
        label = str(r.relative_to(root)) if r != root else r.name
        v, g = known.get(r, (None, None))
        cols.append(trace_column(r, label=f"run {label}", verdict=v, growth=g))
    first = cols[0]
    parts = [f"{c.label}: {c.verdict or 'n/a'}" + (f" ({_deltas(first, c)} against {first.label})" if c is not first
                                                    else "") for c in cols]
    return Proof(cols, "runs", [], {}, "Verdicts: " + "; ".join(parts) + ".")
