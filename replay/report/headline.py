"""The first screen of the report: verdict per pool, the primary cause in one sentence, the holders
that matter, the recommended knobs as ``--set`` arguments, and (beside it) the replayed proof.

Everything here renders a :class:`replay.diagnosis.doctor.DoctorReport` and a
:class:`replay.report.proof.Proof` as HTML; nothing is computed.
"""

from __future__ import annotations

import html

from replay.report.tables import fmt_value, table

#: cause -> one sentence saying what happens (the fix is the recommendation's text)
CAUSE_SENTENCES = {
    "slots_lost_by_allocator": "The allocator loses slots: the pool identity (available + evictable + protected + "
                               "held = capacity) breaks, so memory leaks until the server restarts.",
    "protected_prefix_pinned": "Finished requests left their tree path locked, so their prefix stays protected "
                               "and can never be evicted.",
    "window_lock_held_through_decode": "Each request's prefill SWA window lock is held through its whole decode, "
                                       "keeping SWA slots outside the window.",
    "private_range_kept_until_finish": "Decode never frees out-of-window SWA, so each request keeps its whole "
                                       "private SWA range until it finishes.",
    "unfinished_insert_without_release": "Chunked prefill inserts every chunk as live, locked SWA without freeing "
                                         "what fell out of the window.",
    "all_tombstone_last_leaf": "A leaf that decode had already tombstoned was inserted as live SWA: the tree counts "
                               "slots the allocator holds free.",
}
_VERDICT_CLASS = {"leak": "bad", "growing": "bad", "stable": "good"}


def _hours(h) -> str:
    if h is None:
        return ""
    s = h * 3600
    return f"{s:,.0f} s" if s < 120 else f"{s / 60:,.0f} min" if s < 7200 else f"{h:,.1f} h"


def pool_verdicts(diag) -> list[tuple[str, str, str]]:
    """(pool, verdict, detail) per pool: leaks first, then the growth trend of each pool."""
    out, seen = [], set()
    for v in diag.identity_violations:
        out.append((v["pool"], "leak", f"identity broken at {v['rows']:,} stats rows from step {v['first_step']:,}; "
                                       f"{v['last_unaccounted']:,} slots unaccounted at the end"))
        seen.add(v["pool"])
    for pool, g in diag.growth.items():
        if pool in seen:
            continue
        slope = g.get("slope_tokens_per_hour") or 0.0
        detail = (f"{slope:+,.0f} tokens/h (p = {g.get('p_value', 1.0):.2g}, {g.get('samples', 0)} samples at "
                  f"{g.get('sampled_at', 'comparable load')})")
        if g.get("hours_to_exhaustion") is not None:
            detail += f"; full in {_hours(g['hours_to_exhaustion'])} at this rate"
        out.append((pool, g.get("verdict", "stable"), detail))
    return out


def cause_sentence(diag) -> str:
    if not diag.causes:
        if diag.verdict == "stable":
            return "No cause: no pool grows, no slot is lost, and nothing holds SWA outside the window."
        return "No holder explains it: the growth is not attributed to any SWA holder (see the details)."
    first = diag.causes[0]
    out = _one_cause(first)
    nxt = _actionable(diag)
    if nxt is not first:
        out += " Its knob was already on in this recording" + (
            f"; the next cause: {_one_cause(nxt)}" if nxt is not None else "; no other cause is listed.")
    return out


def _one_cause(c) -> str:
    s = html.escape(CAUSE_SENTENCES.get(c["cause"], c["cause"].replace("_", " ") + "."))
    n = c["holders"]
    return (f"{s} <span class=\"num\">({n:,} holder{'s' if n != 1 else ''}, {c['slot_seconds']:,.0f} slot-s, "
            f"{100 * c['share_of_swa_capacity']:.1f}% of SWA capacity × span)</span>")


def recommended_command(trace: str, diag) -> tuple[str | None, list[str]]:
    """(``kvtrace replay ... --set ...`` line or None, sentences: recommendations without a knob,
    and knobs already on in the recording, which are never recommended again)."""
    sets, env, texts = [], {}, []
    for r in diag.recommendations:
        sets += [s for s in r.get("sets", []) if s not in sets]
        env.update(r.get("env") or {})
        cause = r["cause"].replace("_", " ")
        if r.get("already_on"):
            texts.append(f"{cause}: already on in this recording ({', '.join(r['already_on'])}), so not "
                         "recommended again.")
        if r.get("status", "no_knob" if not r.get("sets") and not r.get("env") else "") == "no_knob":
            texts.append(f"{cause}: no knob (a bug, not a policy): {r['text']}")
    if not sets and not env:
        return None, texts
    cmd = " ".join([*(f"{k}={v}" for k, v in env.items()), "kvtrace replay", trace,
                    *(f"--set {s}" for s in sets), "--out RUN"])
    return cmd, texts


def _actionable(diag):
    """The first cause whose recommendation is not already on (the one the fix is for)."""
    status = {r["cause"]: r.get("status") for r in diag.recommendations}
    return next((c for c in diag.causes if status.get(c["cause"]) != "already_on"), None)


def headline_html(trace_label: str, trace_path: str, diag, proof=None, proof_figure_html: str = "") -> str:
    """The headline block (HTML)."""
    e = html.escape
    items = "".join(f'<li class="{_VERDICT_CLASS.get(v, "")}"><b>{e(p)} pool: {e(v)}</b> &mdash; {e(d)}</li>'
                    for p, v, d in pool_verdicts(diag))
    parts = [f'<h2>Verdict: <span class="{_VERDICT_CLASS.get(diag.verdict, "")}">{e(diag.verdict)}</span> '
             f'<small>({e(trace_label)})</small></h2>',
             f'<ul class="verdicts">{items or "<li>no pool samples</li>"}</ul>',
             f'<p class="cause"><b>Primary cause:</b> {cause_sentence(diag)}</p>']
    holders = [h for h in diag.holders if h.get("cause") in {c["cause"] for c in diag.causes}][:5]
    if holders:
        parts.append("<h3>Holders that matter</h3>" + table(
            ["holder", "cause", "slots", "slot-s", "detail"],
            [[h["holder"], h["cause"], h["slots"], round(h["slot_seconds"], 1), h.get("detail", "")] for h in holders]))
    cmd, texts = recommended_command(trace_path, diag)
    parts.append("<h3>Recommended</h3>")
    if cmd:
        parts.append(f'<pre class="cmd"><code>{e(cmd)}</code></pre>')
    for t in texts:
        parts.append(f'<p class="fix">{e(t)}</p>')
    if not cmd and not texts:
        parts.append("<p>Nothing to change.</p>")
    for n in getattr(diag, "notes", []) or []:
        parts.append(f'<p class="note">{e(str(n))}</p>')
    left = "".join(parts)
    right = proof_html(proof, proof_figure_html) if proof is not None else (
        '<p class="note">No replayed proof: run <code>kvtrace report TRACE --replay</code> to replay the '
        'same requests under the recorded and the recommended settings.</p>')
    return f'<section class="headline"><div class="diag">{left}</div><div class="proof">{right}</div></section>'


def proof_html(proof, figure_html: str = "") -> str:
    from replay.report.figures import METRICS

    cols = proof.columns
    head = ["figure", *[c.label for c in cols]]
    rows = [["verdict", *[c.verdict or "n/a" for c in cols]]]
    pools = sorted({p for c in cols for p in c.growth})
    rows += [[f"{p} pool", *[c.growth.get(p, "n/a") for c in cols]] for p in pools]
    from replay.report.proof import PROOF_METRICS

    for m in PROOF_METRICS:
        vals = [c.metrics.get(m) for c in cols]
        if all(v is None for v in vals):
            continue
        rows.append([METRICS.get(m, (m,))[0], *[("not in a trace" if v is None else fmt_value(v)) for v in vals]])
    where = "" if proof.backend == "runs" else f" ({html.escape(proof.backend)} backend)"
    out = [f"<h2>Replayed proof{where}</h2>", table(head, rows),
           f'<p class="conclusion"><b>{html.escape(proof.conclusion)}</b></p>']
    out += [f'<p class="note">{html.escape(n)}</p>' for n in proof.notes]
    if figure_html:
        out.append(figure_html)
    return "".join(out)
