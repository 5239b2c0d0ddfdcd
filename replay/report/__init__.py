"""``build_report``: one self-contained HTML file (Plotly inlined, opens offline) for a trace,
a run, or a sweep directory of runs: the figures that apply, each run's summary, the manifest,
and the diagnosis (``replay.diagnosis.doctor``) of each trace when it can be computed.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from replay.analysis.runs import SUMMARY_FILE, find_runs, load_summary
from replay.trace import open_trace


def _targets(target: Path) -> list[Path]:
    if (target / "manifest.json").is_file():
        return [target]
    return [p for p in find_runs(target) if (p / "manifest.json").is_file()]


def build_report(target, out, *, resample="1s", diagnose: bool = True, progress: bool = False) -> dict:
    """Write the report of ``target`` (trace, run or sweep directory) to ``out``.

    Returns ``{"out", "figures": [titles], "runs": [paths], "diagnosis": bool}``.
    Raises FileNotFoundError / replay.trace.TraceError naming the path when nothing is readable.
    """
    import plotly.offline

    from replay.report import figures as F

    target, out = Path(target), Path(out)
    runs = _targets(target)
    if not runs:
        raise FileNotFoundError(f"{target}: no trace or run below it; expected a trace directory "
                                "(manifest.json) or a sweep directory of runs")
    figs: list = []
    sections: list[str] = []
    traces = {str(r.relative_to(target)) if r != target else r.name: open_trace(r) for r in runs}
    if len(traces) > 1:
        if all((r / SUMMARY_FILE).is_file() for r in runs):
            figs.append(F.compare_figure(runs))
        figs.append(F.overlay_figure(traces, pool="swa"))
        figs.append(F.overlay_figure(traces, pool="full"))
    first = next(iter(traces.values()))
    if first.rows("stats"):
        figs.append(F.occupancy_figure(first, resample=resample,
                                       title=f"Pool occupancy: {next(iter(traces))}"))
    if first.rows("pool"):
        figs.append(F.churn_figure(first, window=resample, title=f"Allocator churn: {next(iter(traces))}"))
        figs.append(F.allocator_cpu_figure(first, title=f"Allocator CPU time: {next(iter(traces))}"))
    if first.rows("request"):
        figs.append(F.capacity_figure(first))
    diag_ok = False
    for label, tr in traces.items():
        summary = load_summary(tr.path) if (tr.path / SUMMARY_FILE).is_file() else None
        diag = _diagnosis(tr) if diagnose else None
        diag_ok |= diag is not None
        sections.append(_run_section(label, tr, summary, diag))
    titles = [f.layout.title.text for f in figs]
    body = "\n".join(f'<div class="fig">{f.to_html(full_html=False, include_plotlyjs=False)}</div>'
                     for f in figs)
    page = _PAGE.format(title=html.escape(f"kvtrace report: {target}"), plotly=plotly.offline.get_plotlyjs(),
                        target=html.escape(str(target)), figures=body, runs="\n".join(sections))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    return {"out": str(out), "figures": titles, "runs": [str(r) for r in runs], "diagnosis": diag_ok}


def _diagnosis(tr):
    try:
        from replay.diagnosis.doctor import doctor
    except ImportError:
        return None
    try:
        return doctor(tr).to_dict()
    except Exception as e:  # a trace the doctor cannot read still gets its report
        return {"error": f"{type(e).__name__}: {e}"}


def _run_section(label, tr, summary, diag) -> str:
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
                   for k, v in (summary or {}).items() if k != "settings")
    parts = [f"<h2>{html.escape(label)}</h2>"]
    if rows:
        parts.append(f"<h3>Summary</h3><table>{rows}</table>")
    parts.append(f"<h3>Manifest</h3><pre>{html.escape(json.dumps(tr.manifest, indent=1, default=str))}</pre>")
    if diag is not None:
        parts.append(f"<h3>Diagnosis</h3><pre>{html.escape(json.dumps(diag, indent=1, default=str))}</pre>")
    return "<section>" + "".join(parts) + "</section>"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:1400px}} table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:13px}}
pre{{background:#f6f6f6;padding:8px;max-height:400px;overflow:auto;font-size:12px}}</style>
<script type="text/javascript">{plotly}</script></head>
<body><h1>kvtrace report</h1><p>Source: <code>{target}</code></p>
{figures}
{runs}
</body></html>
"""
