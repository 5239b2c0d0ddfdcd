"""``build_report``: one self-contained HTML file (Plotly inlined, opens offline) for a trace, a run,
or a directory of traces and runs (a sweep, ``make demo``'s output), written as an incident
document:

1. the headline (:mod:`replay.report.headline`): verdict per pool, the primary cause in one
   sentence, the holders that matter and the recommended knobs as ``--set`` arguments of the
   primary trace (the recording when the directory has one, else the first run), with the
   replayed proof beside it (:mod:`replay.report.proof`: ``replay=True`` replays the trace under
   the recorded and the recommended settings; a directory of runs shows its runs);
2. the codes (:mod:`replay.report.codes`): a sweep with a ``code=`` level (``kvtrace sweep
   --code``) gets the codes compared (base: the first code; code × policy × grid table of TTFT,
   prefix hits, SWA used, shrunk admissions, retractions, and their bars); a run made with
   ``--code`` is named by its code (spec, target, fingerprint);
3. the evidence figures (:mod:`replay.report.figures`; an all-zero panel is a sentence);
4. the details as HTML tables (:mod:`replay.report.tables`): each trace's summary, manifest
   and diagnosis.

Workloads (request rows only: no ``pool`` or ``stats`` rows) are refused, naming what is missing.
"""

from __future__ import annotations

import html
import tempfile
from pathlib import Path

from replay.errors import KvtraceError

PARTIAL_DIR = ".partial"


def find_traces(target: Path) -> list[Path]:
    """``target`` when it is a trace, else every trace directory below it (sorted; a sweep's
    unfinished ``.partial`` runs left out)."""
    if (target / "manifest.json").is_file():
        return [target]
    return sorted(p.parent for p in target.rglob("manifest.json") if PARTIAL_DIR not in p.parts)


def build_report(target, out, *, resample="1s", diagnose: bool = True, replay: bool = False,
                 backend: str = "reference", progress: bool = False) -> dict:
    """Write the report of ``target`` (trace, run or directory of them) to ``out``.

    Args:
        replay: replay the primary trace under the recorded and the recommended settings
            (``backend``) for the proof beside the headline.
    Returns:
        ``{"out", "figures": [titles], "runs": [paths], "primary", "verdict", "primary_cause",
        "recommended_sets", "proof": Proof.to_dict() or None, "diagnosis": bool, "notes", "codes",
        "code_axis"}``: ``codes`` names each code (spec, target, fingerprint, sha; of a sweep's
        ``code=`` level, else of every run made with ``--code``), ``code_axis`` is
        :meth:`replay.report.codes.CodeAxis.to_dict` of a sweep with a ``code=`` level, else None.
    Raises:
        KvtraceError (TraceError, RunError): nothing readable, a workload, a trace that cannot be replayed.
    """
    import plotly.offline

    from replay.analysis.perfetto import require_memory_rows
    from replay.analysis.runs import SUMMARY_FILE, load_summary
    from replay.runs.summary import figures_only
    from replay.report import figures as F
    from replay.report.codes import code_axis, code_axis_html, run_codes, run_codes_html
    from replay.report.headline import headline_html
    from replay.report.proof import replayed_proof, runs_proof, trace_column
    from replay.report.tables import diagnosis_tables, kv_table
    from replay.trace import open_trace

    target, out = Path(target), Path(out)
    paths = find_traces(target)
    if not paths:
        plan = _plan(target)
        from replay.report.capacity import capacity_section

        capacity_html, capacity = capacity_section(target, _render)
        if capacity is not None or (plan is not None and any(r.get("status") in ("ok", "stopped")
                                                             for r in plan.get("rows", ()))):
            return _sections_only_report(target, out, plan, capacity_html, capacity, plotly.offline.get_plotlyjs())
        plan_notes = plan.get("notes") if isinstance(plan, dict) else None
        if plan_notes:  # a plan none of whose splits completed: say why, from its plan.json
            raise KvtraceError(f"{target}: a plan with no completed split to report ({plan_notes[0]})")
        if figures_only(target):
            raise KvtraceError(f"{target}: a figures-only run (--detail figures) wrote no trace to report; its "
                               f"figures are in {target / SUMMARY_FILE} (replay it with --detail counts for a report)")
        raise KvtraceError(f"{target}: no trace or run below it; expected a trace directory "
                           "(manifest.json) or a directory of traces and runs (a sweep)")
    opened = {p: open_trace(p) for p in paths}
    notes: list[str] = []
    recorded = {}
    for p, tr in opened.items():
        try:
            recorded[p] = require_memory_rows(tr, "report")
        except KvtraceError:
            if len(paths) == 1:
                raise
            notes.append(f"{p}: a workload (no pool or stats rows), left out")
    if not recorded:
        raise KvtraceError(f"{target}: every trace below it is a workload (request rows only: no pool or "
                           "stats rows); report needs recorded traces or runs (kvtrace record / kvtrace replay)")
    label = {p: (str(p.relative_to(target)) if p != target else p.name) for p in recorded}
    runs = [p for p in recorded if (p / SUMMARY_FILE).is_file()]
    axis = code_axis(target, {p: recorded[p] for p in runs}) if runs and target not in runs else None
    if axis is not None:  # the base code's runs first (they are the first column and, without a recording, primary)
        rank = {Path(r["run"]).resolve(): i for i, r in enumerate(axis.rows)}
        runs.sort(key=lambda p: rank.get(p.resolve(), len(rank)))
    primary = next((p for p in recorded if p not in runs), runs[0] if runs else next(iter(recorded)))
    tr = recorded[primary]

    diags, diag_objs = {}, {}
    if diagnose:
        for p, t in recorded.items():
            d, err = _diagnosis(t)
            diag_objs[p] = d
            diags[p] = d.to_dict() if d is not None else {"error": err}
    diag = diag_objs.get(primary)
    if diagnose and diag is None:
        notes.append(f"{primary}: no diagnosis ({diags[primary]['error']})")

    with tempfile.TemporaryDirectory(prefix="kvtrace-report-") as tmp:
        proof = None
        if diag is not None and replay:
            proof = replayed_proof(primary, diag, Path(tmp), backend=backend)
        elif diag is not None and runs and len(recorded) > 1:
            first = None if primary in runs else trace_column(primary, verdict=diag.verdict,
                                                               growth={p: g["verdict"] for p, g in diag.growth.items()})
            known = {p: (d.verdict, _pool_verdicts(d)) for p, d in diag_objs.items() if d is not None}
            proof = runs_proof(first, runs, target, known)
        proof_fig = ""
        if proof is not None:
            series = {c.label: c.path for c in proof.columns}
            proof_fig = "".join(_render(F.overlay_figure(series, pool="swa", column=col, resample=resample,
                                                         title=f"SWA {what} over time: recorded vs replayed"))
                                for col, what in (("not_evictable", "not evictable (used − evictable)"),
                                                  ("used", "used")))
        figs = _evidence(F, tr, label[primary], recorded, label, runs, resample)
        head = (headline_html(label[primary], str(primary), diag, proof, proof_fig) if diag is not None else
                '<section class="headline"><p class="note">No diagnosis: '
                + html.escape("; ".join(notes) or "skipped (--no-diagnosis)") + "</p></section>")
        body = "\n".join(_render(f) for f in figs)
        by_run = run_codes({label[p]: recorded[p] for p in recorded})
        codes_html = (code_axis_html(axis, _render(F.code_figure(axis))) if axis is not None else
                      run_codes_html(by_run))
        plan = _plan(target)
        if plan is not None:  # a kvtrace plan directory: its curves and the recommended split
            codes_html += _plan_html(plan, _render)
        from replay.report.capacity import capacity_section

        capacity_html, capacity = capacity_section(target, _render)  # a kvtrace capacity directory
        codes_html += capacity_html
    warnings = incomplete_traces({label[p]: t for p, t in recorded.items()})
    sections = []
    for p, t in recorded.items():
        summary = load_summary(p) if p in runs else None
        sections.append(_details(label[p], t, summary, diags.get(p), kv_table, diagnosis_tables))
    page = _PAGE.format(title=html.escape(f"kvtrace report: {target}"), plotly=plotly.offline.get_plotlyjs(),
                        target=html.escape(str(target)), headline=head,
                        notes="".join(f'<p class="warn">{html.escape(w)}</p>' for w in warnings)
                        + "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes), codes=codes_html,
                        evidence=_EVIDENCE.format(figures=body, details="\n".join(sections)))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    sets = proof.fix_sets if proof is not None else (
        [s for r in diag.recommendations for s in r.get("sets", [])] if diag is not None else [])
    return {"out": str(out), "figures": [f.layout.title.text for f in figs], "runs": [str(r) for r in runs],
            "primary": str(primary), "verdict": diag.verdict if diag else None,
            "primary_cause": diag.primary_cause if diag else None, "recommended_sets": sets,
            "proof": proof.to_dict() if proof is not None else None, "diagnosis": diag is not None, "notes": notes,
            "incomplete": warnings,
            "codes": axis.codes if axis is not None else [c | {"run": r} for r, c in by_run.items()],
            "code_axis": axis.to_dict() if axis is not None else None,
            "plan": ({"best": plan["best"], "server_args": plan["server_args"]} if plan is not None else None),
            "capacity": capacity}


def incomplete_traces(traces: dict) -> list[str]:
    """One warning per trace (``{label: Trace}``) whose ranks did not end complete or whose events
    were not all written (a recorder killed or failed, then recovered; drops): the report's figures
    cover only what was recorded. The rank files' and drops' checks of ``kvtrace inspect --strict``
    (``replay.trace_checks.check_ranks_accounting``), not the seq scan."""
    from replay.trace_checks import check_ranks_accounting

    out = []
    for label, tr in traces.items():
        problems = [q.message for q in check_ranks_accounting(tr)]
        lost = tr.num_dropped if tr.rows("drops") else 0
        if lost:
            problems.append(f"{lost:,} events lost (counted in the drops family)")
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            out.append(f"incomplete trace {label}: " + "; ".join(problems[:3]) + more
                       + ". The figures cover only what was recorded (kvtrace inspect --strict lists it all).")
    return out


def _sections_only_report(target: Path, out: Path, plan: dict | None, capacity_html: str, capacity: dict | None,
                          plotly_js: str) -> dict:
    """The report of a plan or capacity sweep whose runs kept no trace (both run figures-only
    unless ``--traces``): their sections alone, from ``plan.json`` / ``capacity.json``."""
    note = ("the runs below this directory are figures-only (no traces): the plan's or the curve's tables and "
            "figures only; --traces keeps each run's trace for the evidence figures")
    sections = (_plan_html(plan, _render) if plan is not None else "") + capacity_html
    page = _PAGE.format(title=html.escape(f"kvtrace report: {target}"), plotly=plotly_js,
                        target=html.escape(str(target)), headline="",
                        notes=f'<p class="note">{html.escape(note)}</p>', codes=sections, evidence="")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    return {"out": str(out), "figures": [], "runs": [], "primary": None, "verdict": None, "primary_cause": None,
            "recommended_sets": [], "proof": None, "diagnosis": False, "notes": [note], "incomplete": [],
            "codes": [], "code_axis": None,
            "plan": ({"best": plan["best"], "server_args": plan["server_args"]} if plan is not None else None),
            "capacity": capacity}


def _plan(target) -> dict | None:
    from replay.analysis.plan_curves import load_plan

    try:
        return load_plan(target) if (Path(target) / "plan.json").is_file() else None
    except (OSError, ValueError):
        return None


def _plan_html(plan: dict, render) -> str:
    """The capacity plan's section: the recommended split, the knee, the splits' table, the curves."""
    from replay.analysis.plan_curves import knee, plan_figure

    best, k = plan.get("best"), knee(plan)
    if best:
        head = f"recommended: <code>{html.escape(' '.join(plan['server_args']))}</code>"
    elif plan.get("failed"):  # incomplete: the plan's own note says which failed and what to do
        head = html.escape(plan["notes"][0])
    else:
        head = "no split finished every request without retractions or aborts: raise --kv-gb"
    cells = "".join(
        f"<tr><td>{r['swa_full_tokens_ratio']:g}</td><td>{r['full_pool_tokens']:,}</td><td>{r['swa_pool_tokens']:,}</td>"
        + (f"<td colspan=2>stopped at its first retraction/abort, {r['stopped_at_s']:,.1f} s</td>"
           if r.get("status") == "stopped" else
           f"<td colspan=2>{'refused' if r.get('status') == 'refused' else 'failed'}: {html.escape(r.get('error', ''))}</td>"
           if r.get("status") in ("failed", "refused") else
           f"<td>{r.get('prefix_hit_ratio', '')}</td><td>{r.get('ttft_p99_ms', '')}</td>")
        + f"<td>{r.get('retractions', '')}</td>"
        f"<td>{r.get('aborted', '')}</td><td>{'yes' if r.get('feasible') else 'no'}</td></tr>" for r in plan["rows"])
    return (f'<section class="plan"><h2>Capacity plan ({plan["config"]["kv_gb"]:g} GB)</h2><p>{head}; knee at ratio '
            f'{k["swa_full_tokens_ratio"] if k else "-"}</p><table><tr><th>ratio</th><th>full tokens</th>'
            f'<th>SWA tokens</th><th>hit ratio</th><th>TTFT p99 ms</th><th>retractions</th><th>aborted</th>'
            f'<th>feasible</th></tr>{cells}</table>{render(plan_figure(plan))}</section>')


def _evidence(F, tr, name, recorded, label, runs, resample) -> list:
    figs = [F.occupancy_figure(tr, resample=resample, title=f"Pool occupancy: {name}")]
    if tr.rows("pool"):
        figs.append(F.churn_figure(tr, window=resample, title=f"Allocator churn: {name}"))
        figs.append(F.allocator_cpu_figure(tr, title=f"Allocator CPU time: {name}"))
    if tr.rows("request"):
        figs.append(F.capacity_figure(tr))
    if len(runs) > 1:
        figs.append(F.compare_figure(runs))
    if len(recorded) > 1:
        series = {label[p]: t for p, t in recorded.items()}
        figs.append(F.overlay_figure(series, pool="swa", resample=resample, title="SWA pool used, every trace"))
        figs.append(F.overlay_figure(series, pool="full", resample=resample, title="Full pool used, every trace"))
    return figs


def _pool_verdicts(d) -> dict:
    out = {p: g["verdict"] for p, g in d.growth.items()}
    out.update({v["pool"]: "leak" for v in d.identity_violations})
    return out


def _render(fig) -> str:
    from replay.report.figures import empty_reason, notes

    title = html.escape(str(fig.layout.title.text or ""))
    why = empty_reason(fig)
    if why:
        return f'<div class="fig empty"><p><b>{title}</b>: {html.escape(why)}</p></div>'
    extra = "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes(fig))
    return (f'<div class="fig">{fig.to_html(full_html=False, include_plotlyjs=False, config={"responsive": True})}'
            f"{extra}</div>")


def _diagnosis(tr):
    try:
        from replay.diagnosis.doctor import doctor
    except ImportError as e:
        return None, str(e)
    try:
        return doctor(tr), None
    except Exception as e:  # noqa: BLE001  (a trace the doctor cannot read still gets its report)
        return None, f"{type(e).__name__}: {e}"


def _details(label, tr, summary, diag, kv_table, diagnosis_tables) -> str:
    e = html.escape
    parts = [f"<h3>{e(label)}</h3>"]
    if summary:
        parts.append("<h4>Run summary</h4>" + kv_table({k: v for k, v in summary.items() if k != "settings"})
                     + "<h4>Run settings</h4>" + kv_table(summary.get("settings") or {}))
    parts.append("<h4>Manifest</h4>" + kv_table(tr.manifest))
    if diag is not None:
        parts.append("<h4>Diagnosis</h4>" + (f"<p>{e(diag['error'])}</p>" if "error" in diag else diagnosis_tables(diag)))
    return "<details><summary>" + e(label) + "</summary><section>" + "".join(parts) + "</section></details>"


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:1500px;color:#222}}
table{{border-collapse:collapse;margin:4px 0}} th,td{{border:1px solid #ccc;padding:2px 8px;text-align:left;
font-size:13px;vertical-align:top;overflow-wrap:break-word}} th{{background:#f2f2f2}}
.headline{{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:24px;border:2px solid #444;
padding:12px 18px;border-radius:6px;background:#fafafa}}
.bad{{color:#b00020}} .good{{color:#1b7f3b}} .verdicts li{{margin:3px 0}} .num{{color:#555}}
pre.cmd{{background:#222;color:#eee;padding:8px;white-space:pre-wrap;font-size:13px}}
.note{{color:#555;font-size:13px}} .warn{{color:#8a1f11;background:#fdecea;padding:6px 8px;font-size:13px}} .fig{{margin:18px 0}} .fig.empty p{{background:#f6f6f6;padding:8px}}
details{{margin:8px 0}} summary{{cursor:pointer;font-weight:bold}}</style>
<script type="text/javascript">{plotly}</script></head>
<body><h1>kvtrace incident report</h1><p>Source: <code>{target}</code></p>
{headline}
{notes}
{codes}
{evidence}
</body></html>
"""

#: the evidence figures and the per-trace details (a report with traces; a plan's or a capacity
#: sweep's whose runs kept none has neither, and no empty headings)
_EVIDENCE = """<h2>Evidence</h2>
{figures}
<h2>Details</h2>
{details}"""
