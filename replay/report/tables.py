"""HTML tables for the report's details: manifests, summaries and diagnoses as tables (nested
objects flattened to dotted keys, lists of records as sub-tables), never JSON dumps."""

from __future__ import annotations

import html


def fmt_value(v) -> str:
    """A value for a human: thousands separators, 4 significant digits for fractions, no reprs."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:
            return "—"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        if all(not isinstance(x, (dict, list)) for x in v):
            return ", ".join(fmt_value(x) for x in v) if v else "(none)"
    return str(v)


def table(header, rows, cls: str = "") -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(fmt_value(c)) if not isinstance(c, _Raw) else c}</td>" for c in r)
                   + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


class _Raw(str):
    """Already-rendered HTML inside a table cell."""


def _flatten(obj, prefix=""):
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from _flatten(v, key + ".")
        else:
            yield key, v


def kv_table(obj: dict, cls: str = "kv") -> str:
    """A two-column table of ``obj`` (nested dicts as dotted keys; lists of dicts as sub-tables)."""
    rows = []
    for k, v in _flatten(obj or {}):
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            rows.append([k, _Raw(records_table(v))])
        else:
            rows.append([k, v])
    return table(["key", "value"], rows, cls) if rows else "<p>(empty)</p>"


def records_table(records: list[dict], limit: int = 50) -> str:
    """One row per record, one column per key (the union, in first-seen order)."""
    cols = list(dict.fromkeys(k for r in records[:limit] for k in r))
    rows = [[_Raw(kv_table(r[c])) if isinstance(r.get(c), dict) and r.get(c) else r.get(c) for c in cols]
            for r in records[:limit]]
    more = f"<p>… and {len(records) - limit:,} more</p>" if len(records) > limit else ""
    return table(cols, rows) + more


def diagnosis_tables(d: dict) -> str:
    """The doctor's result (``DoctorReport.to_dict()``) as headed tables."""
    parts = [kv_table({k: d.get(k) for k in ("verdict", "primary_cause", "num_holders") if k in d})]
    if d.get("growth"):
        parts.append("<h4>Growth per pool</h4>" + records_table([{"pool": p, **g} for p, g in d["growth"].items()]))
    for key, title in (("identity_violations", "Identity violations"), ("causes", "Causes"),
                       ("recommendations", "Recommendations"), ("holders", "Holders")):
        if d.get(key):
            parts.append(f"<h4>{title}</h4>" + records_table(d[key]))
    if d.get("notes"):
        parts.append("<h4>Notes</h4><ul>" + "".join(f"<li>{html.escape(str(n))}</li>" for n in d["notes"]) + "</ul>")
    return "".join(parts)
