"""The report's 'Capacity curves' section for a ``kvtrace capacity`` directory (``capacity.json``):
what was swept, the sizes' table (tokens, GB, hit ratios, TTFT, retractions, SWA used, the
one-pass bound) and the curves (:func:`replay.analysis.capacity_curves.capacity_figure`)."""

from __future__ import annotations

import html
from pathlib import Path


def capacity_section(target, render) -> tuple[str, dict | None]:
    """(HTML section, ``{"pool", "sizes_tokens", "rows"}`` for the report's JSON) of ``target`` when
    it holds a ``capacity.json``; ``("", None)`` otherwise (or when it cannot be read)."""
    from replay.runs.capacity import CAPACITY_FILE, load_capacity
    from replay.runs.summary import RunError

    if not (Path(target) / CAPACITY_FILE).is_file():
        return "", None
    try:
        res = load_capacity(target)
    except RunError:
        return "", None
    return _html(res, render), {"pool": res.config.pool, "sizes_tokens": list(res.config.sizes_tokens),
                                "rows": len(res.rows), "notes": list(res.notes)}


def _cell(v, fmt: str = "") -> str:
    return "-" if v is None else format(v, fmt)


def _html(res, render) -> str:
    from replay.analysis.capacity_curves import capacity_figure

    c = res.config
    fixed = ", ".join(f"{k} {getattr(c, k):,}" for k in ("full_pool_tokens", "swa_pool_tokens", "host_pool_tokens")
                      if not k.startswith(c.pool))
    head = (f"{html.escape(c.pool)} pool swept over {len(c.sizes_tokens)} sizes ({html.escape(fixed)}; policy "
            f"{html.escape(c.policy)}, {html.escape(c.backend)} backend); bytes per token from "
            f"{html.escape(res.kv_bytes_source)}. The one-pass column is the full pool's LRU hit ratio, the fast "
            "bound of the device prefix hits.")
    cols = ("tokens", "GB", "status", "hit ratio", "host hit ratio", "TTFT p50 ms", "TTFT p99 ms", "retractions",
            "aborted", "peak SWA used", "mean SWA used", "one-pass")
    cells = []
    for r in res.rows:
        vals = (f"{r['size_tokens']:,}", _cell(r.get("size_gb"), ".3f"), r["status"] + (
                f": {r.get('error', '')}" if r["status"] != "ok" else ""), _cell(r.get("prefix_hit_ratio"), ".4f"),
                _cell(r.get("host_hit_ratio"), ".4f"), _cell(r.get("ttft_p50_ms"), ".1f"),
                _cell(r.get("ttft_p99_ms"), ".1f"), _cell(r.get("retractions")), _cell(r.get("aborted")),
                _cell(r.get("peak_swa_used"), ","), _cell(r.get("mean_swa_used"), ",.0f"),
                _cell(r.get("one_pass_hit_ratio"), ".4f"))
        cells.append("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in vals) + "</tr>")
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in res.notes)
    return (f'<section class="capacity"><h2>Capacity curves ({html.escape(c.pool)} pool)</h2><p>{head}</p>{notes}'
            "<table><tr>" + "".join(f"<th>{h}</th>" for h in cols) + "</tr>" + "".join(cells) + "</table>"
            + render(capacity_figure(res)) + "</section>")


__all__ = ["capacity_section"]
