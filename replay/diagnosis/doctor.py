"""``kvtrace doctor``: explain SWA growth and leaks in a trace, and name the knob that stops them.

``doctor(trace)`` returns a :class:`DoctorReport` with

- ``identity_violations``: per pool, the stats rows where ``available + evictable + protected +
  held != capacity`` (a leak), the first step it appears and its growth in pages;
- ``growth``: per pool, a Theil–Sen slope and Mann–Kendall p-value of the non-evictable usage
  (``capacity - available - evictable``) sampled at comparable load (drains: samples where no
  request holds private KV; with fewer than ``MIN_DRAINS`` of them, the lowest-load sample of each
  of ``BINS`` time bins), in tokens/hour, with the projected time to exhaustion and a verdict
  ``growing`` (p < ``ALPHA``, rising by at least one page) or ``stable``;
- ``holders`` and ``causes``: SWA slots held outside the window, by request and cause, with
  slot-seconds (see :mod:`replay.diagnosis.holders`);
- ``recommendations``: the DESIGN.md §5 knobs that address each cause, with the backend
  ``--set`` overrides (``sets``) and ``SGLANG_*`` switches (``env``) that express them (used by
  ``--replay``), compared with the settings the trace was recorded with (``recorded_knobs``):
  a value already recorded is never recommended; it is listed under ``already_on`` and the
  recommendation's ``status`` says ``already_on`` (every value recorded), ``recommended`` or
  ``no_knob`` (a bug, not a policy). :attr:`DoctorReport.fix_sets` / ``fix_env`` are what is left.

Slot-seconds and shares are bounded by the SWA pool (:mod:`replay.diagnosis.shares`): a share of
capacity x span is always in [0, 1].

Exit status of ``kvtrace doctor`` (and ``kvtrace verify``): 0 healthy (verdict ``stable``), 1 a
leak or growth found (``leak``, ``growing``), 2 refused input (see docs/diagnosis.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replay.diagnosis.columns import POOL_NAMES, load_cache, load_requests, load_stats
from replay.diagnosis.holders import attribute
from replay.diagnosis.shares import bound_holders
from replay.diagnosis.trend import NS_PER_HOUR, trend
from tracer.schema import Pool

ALPHA = 0.05
MIN_DRAINS = 8
BINS = 24
MIN_SHARE = 0.005  # a cause is listed when its slot-seconds reach this share of SWA capacity x span
# Leaks first, then pinned growth, then the rest by slot-seconds.
SEVERITY = {"slots_lost_by_allocator": 0, "protected_prefix_pinned": 1, "all_tombstone_last_leaf": 1}

RECOMMENDATIONS = {
    "slots_lost_by_allocator": {
        "knobs": [], "sets": [],
        "text": ("slots are lost by the allocator (a leak, not a policy): run `kvtrace verify` for "
                 "the first step it appears; pre-#36135 servers resolve the SWA peer at "
                 "free_group_end and lose it: upgrade, and set SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE")},
    "protected_prefix_pinned": {
        "knobs": ["prefix_ownership"], "sets": [],
        "text": ("finished requests left their tree path locked: every lock receipt must be "
                 "unlocked (release_kv_cache); with an external host cache, "
                 "prefix_ownership=eic_release_protected_prefix releases the protected prefix")},
    "window_lock_held_through_decode": {
        "knobs": ["release_prefill_swa (SGLANG_OPT_RELEASE_PREFILL_SWA)"], "sets": [],
        "env": {"SGLANG_OPT_RELEASE_PREFILL_SWA": "true"},
        "text": ("release the prefill SWA window lock once decode has moved a window past it "
                 "(SGLANG_OPT_RELEASE_PREFILL_SWA=true; 0.5.23 default off)")},
    "private_range_kept_until_finish": {
        "knobs": ["swa_out_of_window_release=decode_only", "swa_eviction_interval_tokens"],
        "sets": ["swa_eviction_interval_tokens={window}"],
        "text": "free out-of-window SWA during decode, every window (SGLANG_SWA_EVICTION_INTERVAL <= W)"},
    "unfinished_insert_without_release": {
        "knobs": ["swa_out_of_window_release=decode_and_unfinished_insert",
                  "swa_free_out_of_window_at_insert=true"],
        "sets": ["swa_out_of_window_release=decode_and_unfinished_insert"],
        "text": "free out-of-window SWA when a chunk of an unfinished request is inserted (#27402)"},
    "all_tombstone_last_leaf": {
        "knobs": ["swa_release_boundary=max_window_page"], "sets": ["swa_release_boundary=max_window_page"],
        "text": ("the tree counts SWA slots the allocator holds free: a leaf decode had already "
                 "tombstoned was inserted as live. Keep ceil_page(max(W, ps)) above the release "
                 "frontier so the last leaf keeps live SWA (#29860), on an insert path that "
                 "inserts a fully out-of-window span as a tombstone (#22470; sglang >= 0.5.23)")},
}


@dataclass
class DoctorReport:
    trace: str
    identity_violations: list[dict]
    growth: dict
    holders: list[dict]
    causes: list[dict]
    recommendations: list[dict]
    replay: dict | None = None
    notes: list[str] = field(default_factory=list)
    recorded_knobs: dict = field(default_factory=dict)
    recorded_env: dict = field(default_factory=dict)

    @property
    def fix_sets(self) -> list[str]:
        """``key=value`` overrides recommended beyond the recorded settings (``--set``)."""
        return list(dict.fromkeys(s for r in self.recommendations for s in r["sets"]))

    @property
    def fix_env(self) -> dict:
        """``SGLANG_*`` switches recommended beyond the recorded ones."""
        return {k: v for r in self.recommendations for k, v in r["env"].items()}

    @property
    def primary_cause(self) -> str | None:
        return self.causes[0]["cause"] if self.causes else None

    @property
    def verdict(self) -> str:
        if self.identity_violations:
            return "leak"
        return "growing" if any(g["verdict"] == "growing" for g in self.growth.values()) else "stable"

    def to_dict(self) -> dict:
        return {"trace": self.trace, "verdict": self.verdict, "primary_cause": self.primary_cause,
                "identity_violations": self.identity_violations, "growth": self.growth,
                "holders": self.holders[:50], "num_holders": len(self.holders), "causes": self.causes,
                "recommendations": self.recommendations, "fix_sets": self.fix_sets, "fix_env": self.fix_env,
                "recorded_knobs": self.recorded_knobs, "recorded_env": self.recorded_env,
                "replay": self.replay, "notes": self.notes}


def doctor(trace, *, rank: int = 0, replay: bool = False, progress: bool = False,
           verbose: bool = False, code=None, env=()) -> DoctorReport:
    """Diagnose ``trace`` (a directory or an opened Trace); see the module docstring.

    Args:
        replay: also re-run the trace's workload under the recorded settings and under the
            recommended ones (``replay.diagnosis.rerun``) and say whether the growth disappears.
        verbose: with ``replay``, let sglang's log lines and warnings through to the terminal
            (otherwise they go to a log file, named in ``replay["log"]``).
        code: with ``replay``, re-run on this code (``SPEC`` or ``NAME=SPEC``) in its own process
            (``replay.diagnosis.rerun``: its policy knobs are its own; recommended switches apply).
        env: with ``replay`` and ``code``, ``K=V`` for the code's process over the recorded switches.
    Raises:
        DiagnosisError: no ``stats`` rows; TraceError: unreadable trace; RunError: ``code``/``env``
            without ``replay``, or a code that cannot be prepared or matched (before any diagnosis).
    """
    from replay.trace import Trace, open_trace

    resolved = None
    if code is not None or env:
        from replay.runs.code import one_code
        from replay.runs.replay import RunError

        if not replay:
            raise RunError("--code/--env apply to the re-runs of --replay; add --replay")
        resolved = one_code(code, env)

    tr = trace if isinstance(trace, Trace) else open_trace(trace)
    server = tr.manifest.get("server") or {}
    page = int(server.get("page_size") or 1)
    window = int(server.get("sliding_window_tokens") or 0)
    st = load_stats(tr, rank)
    rep = DoctorReport(str(tr.path), _identity(st, page), _growth(st, page, *_step_of_samples(tr, rank, st)),
                       [], [], [])
    if tr.num_dropped:
        rep.notes.append(f"{tr.num_dropped} events were dropped while recording; attribution may "
                         "miss them (drop gaps are not leaks)")
    if window > 0:
        rep.holders = attribute(load_cache(tr, rank), load_requests(tr, rank), st, window=window, page=page)
    rep.holders, rep.causes = _causes(rep.holders, st)
    rep.recorded_knobs, rep.recorded_env = recorded(tr)
    rep.recommendations = [_recommend(c["cause"], window, rep.recorded_knobs, rep.recorded_env)
                           for c in rep.causes]
    if replay:
        from replay.diagnosis.rerun import replay_compare

        rep.replay = replay_compare(tr, rep, diagnose=doctor, progress=progress, verbose=verbose,
                                    code=resolved, env=env)
    return rep


def _identity(st, page: int) -> list[dict]:
    out = []
    gap = st.capacity - (st.available + st.evictable + st.protected + st.held)
    for p in np.unique(st.pool):
        m = st.pool == p
        g = gap[m]
        bad = np.flatnonzero(g != 0)
        if not len(bad):
            continue
        f = bad[0]
        out.append({"pool": POOL_NAMES.get(int(p)), "rows": int(len(bad)), "first_seq": int(st.seq[m][f]),
                    "first_step": int(st.forward_ct[m][f]), "first_ts_ns": int(st.ts_ns[m][f]),
                    "first_unaccounted": int(g[f]), "last_unaccounted": int(g[-1]),
                    "max_unaccounted": int(g.max()),
                    "growth_pages": round(float(g[-1] - g[f]) / page, 2)})
    return out


def _samples(st, step: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, str]:
    """Steps (positions, see :func:`_step_of_samples`) at comparable load: drains, else the
    lightest batch size seen at enough steps, else the lightest sample of each time bin."""
    fm = st.pool == int(Pool.FULL)
    steps, held = step[fm], st.held[fm]
    drains = np.flatnonzero(held == 0)
    if len(drains) >= MIN_DRAINS:
        return steps[drains], "drains (no request-private KV)"
    sizes = np.full(len(steps), -1, dtype=np.int64)
    known = steps >= 0
    sizes[known] = batch[steps[known]]
    for b in np.unique(sizes[sizes >= 0]):
        at = np.flatnonzero(sizes == b)
        if len(at) >= MIN_DRAINS:
            return steps[at], f"steps with batch size {int(b)}"
    load = (st.held + st.protected)[fm]
    bins = np.array_split(np.arange(len(steps)), min(BINS, len(steps)))
    pick = [b[np.argmin(load[b])] for b in bins if len(b)]
    return steps[np.asarray(pick, dtype=np.int64)], f"lowest-load sample of {len(pick)} time bins"


def _growth(st, page: int, step: np.ndarray, batch: np.ndarray) -> dict:
    steps, how = _samples(st, step, batch)
    out = {}
    for p in np.unique(st.pool):
        m = st.pool == p
        sel = m & np.isin(step, steps)
        if sel.sum() < 3:
            continue
        # non-evictable usage minus request-private KV (load): protected + slots nobody owns
        used = (st.capacity - st.available - st.evictable - st.held)[sel]
        tr = trend(st.ts_ns[sel], used)
        cap = int(st.capacity[sel][-1])
        growing = tr.p_value < ALPHA and tr.slope_tokens_per_hour > 0 and tr.rise_tokens >= page
        left = cap - float(used[-1])
        hours = left / tr.slope_tokens_per_hour if growing else None
        out[POOL_NAMES.get(int(p))] = dict(tr.to_dict(), capacity=cap, sampled_at=how,
                                           verdict="growing" if growing else "stable",
                                           hours_to_exhaustion=None if hours is None else round(hours, 3))
    return out


def _step_of_samples(tr, rank: int, st) -> tuple[np.ndarray, np.ndarray]:
    """Each ``stats`` row's step, and the batch size (the load) of each step.

    A step is the position of its ``sched`` step row in the trace (0 = the first), and a stats
    row belongs to the last step row before it (-1: none; the hooks sample after the step row).
    Not ``forward_ct`` (the rule of :mod:`replay.steps`, here on numpy arrays): sglang's own
    Scheduler counts batches run, so an idle step's rows repeat the number of the batch step
    before it."""
    from replay.diagnosis.columns import codes, num
    from tracer.schema import SchedKind

    t = tr.table("sched", rank).select(["seq", "kind", "batch_size"])
    is_step = codes(t.column("kind"), SchedKind) == int(SchedKind.STEP)
    seq, batch = num(t, "seq")[is_step], num(t, "batch_size")[is_step]
    order = np.argsort(seq, kind="stable")
    return np.searchsorted(seq[order], st.seq, side="left") - 1, batch[order]


def _causes(holders: list[dict], st) -> tuple[list[dict], list[dict]]:
    """(holders with bounded slot-seconds, causes): per cause its holders, bounded slot-seconds
    (:func:`replay.diagnosis.shares.bound_holders`) and share of SWA capacity x span (<= 1)."""
    holders, by_cause, grid = bound_holders(holders, st)
    agg: dict[str, dict] = {}
    for h in holders:
        a = agg.setdefault(h["cause"], {"cause": h["cause"], "holders": 0, "slot_seconds": 0.0,
                                        "max_slots": 0, "rids": []})
        a["holders"] += 1
        a["max_slots"] = max(a["max_slots"], int(h["slots"]))
        if h["rid"] >= 0 and len(a["rids"]) < 20 and int(h["rid"]) not in a["rids"]:
            a["rids"].append(int(h["rid"]))
    out = []
    for a in agg.values():
        a["share_of_swa_capacity"] = round(grid.share(by_cause[a["cause"]]), 4)
        a["slot_seconds"] = round(by_cause[a["cause"]], 3)
        if a["share_of_swa_capacity"] >= MIN_SHARE or a["cause"] in SEVERITY:
            out.append(a)
    return holders, sorted(out, key=lambda a: (SEVERITY.get(a["cause"], 9), -a["slot_seconds"]))


def recorded(tr) -> tuple[dict, dict]:
    """(knob values, ``SGLANG_*`` switches) the trace was recorded with: the manifest's recorded
    settings (:func:`replay.backends.dsv4.recorded_settings`: a DeepSeek-V4 capture's completed
    from its stack's facts) and ``env``, then ``backend.json``'s ``settings`` and ``env`` (written
    by ``kvtrace record``) over them."""
    import json
    from pathlib import Path

    from replay.backends.dsv4 import recorded_settings
    from replay.knobs import KNOB_BY_NAME, KnobError

    knobs = recorded_settings(tr.path, tr.manifest)
    env = {k: str(v) for k, v in (tr.manifest.get("env") or {}).items() if str(k).startswith("SGLANG_")}
    try:
        meta = json.loads((Path(tr.path) / "backend.json").read_text())
    except (OSError, ValueError):
        meta = {}
    if isinstance(meta, dict):
        for name, raw in (meta.get("settings") or {}).items():
            if name in KNOB_BY_NAME:
                try:
                    knobs[name] = KNOB_BY_NAME[name].parse(raw)
                except KnobError:
                    continue
        env |= {str(k): str(v) for k, v in (meta.get("env") or {}).items()}
    return knobs, env


def _truthy(v) -> str:
    text = str(v).strip().lower()
    return {"1": "true", "yes": "true", "on": "true", "0": "false", "no": "false", "off": "false"}.get(text, text)


def _set_is_on(item: str, knobs: dict, window: int) -> bool:
    from replay.knobs import KnobError, parse_sets

    try:
        ((name, want),) = parse_sets([item]).items()
    except KnobError:
        return False
    have = knobs.get(name)
    if have is None:
        return False
    if name == "swa_eviction_interval_tokens":  # any interval up to the window frees every window
        return 0 < int(have) <= max(int(want), window)
    return have == want


def _recommend(cause: str, window: int, knobs: dict | None = None, env: dict | None = None) -> dict:
    """The recommendation for ``cause``, less what the trace was recorded with."""
    r = RECOMMENDATIONS[cause]
    knobs, env = knobs or {}, env or {}
    sets = [s.format(window=max(window, 1)) for s in r["sets"]]
    want_env = dict(r.get("env", {}))
    on = [s for s in sets if _set_is_on(s, knobs, window)]
    on += [f"{k}={v}" for k, v in want_env.items() if _truthy(env.get(k, "")) == _truthy(v)]
    left_sets = [s for s in sets if s not in on]
    left_env = {k: v for k, v in want_env.items() if f"{k}={v}" not in on}
    status = "no_knob" if not sets and not want_env else ("already_on" if not left_sets and not left_env
                                                           else "recommended")
    return {"cause": cause, "knobs": r["knobs"], "text": r["text"], "sets": left_sets, "env": left_env,
            "already_on": on, "status": status}


def hours(ns: float) -> float:
    return ns / NS_PER_HOUR
