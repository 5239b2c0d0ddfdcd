"""The code axis of a report: runs of a sweep made with ``--code`` compared code against code.

A sweep with ``--code pre=A,post=B`` has a ``code=<name>`` level above ``policy=``
(``RUNS/code=<name>/policy=<p>/<k>=<v>/``, grid keys ``env.NAME`` included). :func:`code_axis`
reads its runs with :func:`replay.runs.compare.compare` (the base is the sweep's first code; deltas
at the same policy and grid point, as ``kvtrace compare`` gives them) plus the shrunk admissions
of each run's trace (``sched`` rows ``kind=admit``, ``verdict=shrunk``), and names every code from
its runs' manifests (``run.code``: spec, target, fingerprint, sha). Codes that have no run (a code
that could not be prepared) come from ``summary.parquet`` with their error.

:func:`run_codes` names the code of runs that were made with ``--code`` outside a sweep's code
level (``kvtrace replay --code``): the report of a single run says what code it ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

#: the figures of the code comparison, in order (summary keys, plus ``shrunk_admissions``)
CODE_FIGURES = ("finished", "ttft_p50_ms", "ttft_p99_ms", "prefix_hit_ratio", "peak_swa_used", "mean_swa_used",
                "shrunk_admissions", "retractions")
#: what each code is named by (``run.code`` keys of the manifest)
CODE_FIELDS = ("name", "spec", "target", "fingerprint", "fingerprint_known", "sha")


@dataclass
class CodeAxis:
    """Runs of a ``code=`` level: ``codes`` in the sweep's order (the first is ``base``), ``keys``
    the columns that make a point (``policy`` and the grid keys), ``rows`` one dict per run
    (``run`` path, ``label``, ``code``, the keys, :data:`CODE_FIGURES`)."""

    base: str
    codes: list[dict]
    keys: list[str]
    rows: list[dict]
    figures: tuple = CODE_FIGURES
    notes: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        """The codes that have runs, base first."""
        return [c["name"] for c in self.codes if c.get("runs")]

    def points(self) -> list[tuple]:
        """The (policy, grid values) points, in the runs' order."""
        return list(dict.fromkeys(tuple(r.get(k) for k in self.keys) for r in self.rows))

    def value(self, code: str, point: tuple, figure: str):
        """``figure`` of ``code``'s run at ``point`` (None: no such run)."""
        for r in self.rows:
            if r["code"] == code and tuple(r.get(k) for k in self.keys) == point:
                return r.get(figure)
        return None

    def table(self):
        """The code × policy (× grid) table as a polars DataFrame: one row per figure and point,
        one column per code (its value), ``<code>_delta`` against the base at the same point."""
        import polars as pl

        rows = []
        for f in self.figures:
            for pt in self.points():
                row = {"figure": f} | dict(zip(self.keys, pt))
                b = self.value(self.base, pt, f)
                for c in self.names:
                    v = self.value(c, pt, f)
                    row[c] = None if v is None else float(v)
                    if c != self.base:
                        row[f"{c}_delta"] = None if v is None or b is None else float(v - b)
                rows.append(row)
        return pl.DataFrame(rows, infer_schema_length=None)

    def to_dict(self) -> dict:
        return {"base": self.base, "codes": self.codes, "keys": self.keys, "figures": list(self.figures),
                "rows": self.rows, "notes": self.notes}


def run_code(manifest: dict) -> dict | None:
    """The ``run.code`` block of a manifest (:data:`CODE_FIELDS`), None for a run without one."""
    code = (manifest.get("run") or {}).get("code") if isinstance(manifest, dict) else None
    if not isinstance(code, dict) or not code.get("name"):
        return None
    return {k: code.get(k) for k in CODE_FIELDS}


def run_codes(traces: dict) -> dict:
    """``{label: code}`` of the traces (``{label: Trace}``) whose manifest names a code."""
    out = {}
    for label, tr in traces.items():
        c = run_code(tr.manifest)
        if c is not None:
            out[label] = c
    return out


def shrunk_admissions(trace) -> int | None:
    """Admissions whose chunk was cut under SWA pressure (``sched`` rows ``kind=admit``,
    ``verdict=shrunk``); None when the trace has no ``sched`` rows."""
    import polars as pl

    if not trace.rows("sched"):
        return None
    s = trace.lazy("sched").filter((pl.col("kind") == "admit") & (pl.col("verdict") == "shrunk"))
    return int(s.select(pl.len()).collect().item())


def code_axis(target, traces: dict | None = None) -> CodeAxis | None:
    """The code axis of the runs under ``target``; None when no run has a ``code=`` level.

    Args:
        target: a sweep directory (or a folder holding one).
        traces: ``{run path: Trace}`` already opened (the shrunk admissions are read from them;
            others are opened here).
    """
    from replay.runs.compare import FIGURES, compare, find_runs
    from replay.runs.replay import RunError
    from replay.trace import open_trace

    target = Path(target)
    try:
        found = list(dict.fromkeys(part.partition("=")[2] for p in find_runs(target)
                                   for part in _rel_parts(p, target) if part.startswith("code=")))
    except (RunError, ValueError):
        return None
    if not found:
        return None
    order, specs, failed = _sweep_codes(target)
    names = [c for c in order if c in found] + [c for c in found if c not in order]
    base = names[0]
    df = compare(target, base=base)

    keys = [c for c in df.columns if c not in ("run", "code", "base") and c not in FIGURES
            and not c.endswith(("_delta", "_delta_pct"))]
    traces = {Path(p).resolve(): t for p, t in (traces or {}).items()}
    rows, info = [], {}
    for r in df.filter(df["code"].is_not_null()).iter_rows(named=True):
        path = Path(r["run"])
        tr = traces.get(path.resolve()) or open_trace(path)
        info.setdefault(r["code"], run_code(tr.manifest) or {"name": r["code"]})
        info[r["code"]]["runs"] = info[r["code"]].get("runs", 0) + 1
        row = {"run": str(path), "label": _rel(path, target), "code": r["code"]} | {k: r.get(k) for k in keys}
        row |= {f: r.get(f) for f in CODE_FIGURES if f != "shrunk_admissions"}
        row["shrunk_admissions"] = shrunk_admissions(tr)
        rows.append(row)
    rank = {c: i for i, c in enumerate(names)}
    rows.sort(key=lambda r: rank[r["code"]])
    codes = [info[c] | {"status": "ok", "failed_runs": failed.get(c, {}).get("runs", 0)} for c in names]
    notes = []
    for name, f in failed.items():
        if name in info:
            notes.append(f"code {name}: {f['runs']} run(s) failed: {f['error']}")
        else:
            codes.append({"name": name, "spec": specs.get(name, ""), "status": "failed", "runs": 0,
                          "failed_runs": f["runs"], "error": f["error"]})
    return CodeAxis(base, codes, keys, rows, notes=notes)


def _rel_parts(path: Path, root: Path) -> tuple:
    try:
        return path.resolve().relative_to(root.resolve()).parts
    except ValueError:
        return ()


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve())) or path.name
    except ValueError:
        return path.name


def _sweep_codes(target: Path) -> tuple[list[str], dict, dict]:
    """(codes in ``--code`` order, {name: spec}, {name: {"runs", "error"}} of failed runs) from the
    ``sweep.json`` and ``summary.parquet`` of ``target`` or of the sweep below it."""
    sweep = target / "sweep.json"
    if not sweep.is_file():
        found = sorted(p for p in target.glob("*/sweep.json"))
        sweep = found[0] if len(found) == 1 else sweep
    try:
        specs = dict(json.loads(sweep.read_text()).get("codes") or {})
    except (OSError, ValueError, AttributeError):
        specs = {}
    failed: dict = {}
    table = sweep.parent / "summary.parquet"
    if specs and table.is_file():
        import polars as pl

        try:
            df = pl.read_parquet(table)
        except Exception:  # noqa: BLE001  (a half-written table: the runs themselves still count)
            df = None
        if df is not None and {"code", "status"} <= set(df.columns):
            for r in df.filter(pl.col("status") != "ok").iter_rows(named=True):
                f = failed.setdefault(r["code"], {"runs": 0, "error": r.get("error") or r["status"]})
                f["runs"] += 1
    return list(specs), specs, failed




def _figure_name(f: str) -> str:
    from replay.report.figures import METRICS

    return METRICS.get(f, (f,))[0]


def cell_text(v, base, is_base: bool) -> str:
    """A value with its change against the base code: counts as ``+3``, fractions and times as ``%``."""
    from replay.report.tables import fmt_value

    if v is None:
        return "— (no run)"
    text = fmt_value(v)
    if is_base or base is None:
        return text
    d = v - base
    if d == 0:
        return text + " (same)"
    if isinstance(v, int) and isinstance(base, int):
        return f"{text} ({d:+,})"
    return f"{text} ({100 * d / abs(base):+.1f} %)" if base else f"{text} ({d:+.4g})"


def _fingerprint(c: dict) -> str:
    fp = c.get("fingerprint") or "—"
    known = c.get("fingerprint_known")
    return fp if known is None else f"{fp} ({'known' if known else 'unknown'})"


def _status(c: dict) -> str:
    if c["status"] != "ok":
        return f"{c['status']}: {c.get('error') or 'no run'}"
    return "ok" if not c.get("failed_runs") else f"ok, {c['failed_runs']} run(s) failed (see below)"


def code_line(label: str, c: dict) -> str:
    """One sentence naming a run's code (HTML)."""
    import html

    e = html.escape
    return (f'<p class="code"><b>Code of {e(label)}: {e(str(c.get("name")))}</b> &mdash; spec '
            f'<code>{e(str(c.get("spec") or "—"))}</code>, target <b>{e(str(c.get("target") or "unknown"))}</b>, '
            f'fingerprint {e(_fingerprint(c))}, sha {e(str(c.get("sha") or "—"))}</p>')


def run_codes_html(codes: dict) -> str:
    """The codes of runs made with ``--code`` outside a ``code=`` level: a sentence for one run,
    else a table (one row per run)."""
    from replay.report.tables import table

    if not codes:
        return ""
    if len(codes) == 1:
        label, c = next(iter(codes.items()))
        return '<section class="codes"><h2>Code</h2>' + code_line(label, c) + "</section>"
    rows = [[label, c.get("name"), c.get("spec"), c.get("target"), _fingerprint(c), c.get("sha")]
            for label, c in codes.items()]
    return ('<section class="codes"><h2>Code of each run</h2>'
            + table(["run", "code", "spec", "target", "fingerprint", "sha"], rows) + "</section>")


def code_axis_html(axis: CodeAxis, figure_html: str = "") -> str:
    """The report's code section: the codes (spec, target, fingerprint), then the code × policy ×
    grid table of :data:`CODE_FIGURES` with each code's change against the base code."""
    import html

    from replay.report.tables import table

    e = html.escape
    crossed = " × ".join(["code"] + axis.keys)
    parts = ["<h2>Codes compared</h2>",
             f'<p class="note">{len(axis.names)} code(s), each run in its own process ({e(crossed)}); base '
             f'<b>{e(axis.base)}</b>: changes are against its run at the same policy and grid point '
             "(as <code>kvtrace compare</code> gives them).</p>"]
    rows = [[c["name"] + (" (base)" if c["name"] == axis.base else ""), c.get("spec") or "—",
             c.get("target") or "—", _fingerprint(c), c.get("sha") or "—", c.get("runs", 0),
             _status(c)]
            for c in axis.codes]
    parts.append(table(["code", "spec", "target", "fingerprint", "sha", "runs", "status"], rows, "codes"))
    body = []
    for f in axis.figures:
        for i, pt in enumerate(axis.points()):
            base = axis.value(axis.base, pt, f)
            body.append([_figure_name(f) if i == 0 else "", *["—" if v is None else v for v in pt],
                         *[cell_text(axis.value(c, pt, f), base, c == axis.base) for c in axis.names]])
    parts.append(f"<h3>{e(crossed)}</h3>" + table(["figure", *axis.keys, *axis.names], body, "code-axis"))
    parts += [f'<p class="note">{e(n)}</p>' for n in axis.notes]
    if figure_html:
        parts.append(figure_html)
    return '<section class="codes">' + "".join(parts) + "</section>"


__all__ = ["CODE_FIELDS", "CODE_FIGURES", "CodeAxis", "cell_text", "code_axis", "code_axis_html", "code_line",
           "run_code", "run_codes", "run_codes_html", "shrunk_admissions"]
