"""``kvtrace doctor --replay``: re-run a trace's workload under the recorded settings and under the
recommended ones, on the real sglang backend, and say whether the growth disappears.

The workload is the trace's own ``request`` arrival rows. The recorded settings come from the
trace's ``backend.json`` (written by ``kvtrace record``) or, without it, from the manifest's
``server`` block. A planted bug named in ``backend.json`` (``incident``) is planted again in the
recorded run and left out of the recommended one (the fix). ``SGLANG_*`` switches the backend settings have no knob for
(``backend.json`` ``env``, and a recommendation's ``env``) are set around each run. Runs go
through ``replay.record.record_workload`` rather than ``replay.runs.replay_run``, which takes
``--set`` overrides only and so cannot carry the planted bug or those switches.

With ``--code SPEC`` both runs are on that code, in its own process (``record_workload(code=...)``):
the recorded sizes and switches, ``--env`` over them; a commit's policy knobs are its own, so a
recommended policy knob (and a planted bug) is left out and listed in ``not_applied``, and the
recommended run applies the recommended ``SGLANG_*`` switches (run only when there are some). The
recorded run on the code says whether the trace's problem is there on that code at all
(``growth_disappears_on_code``).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

SERVER_TO_SETTING = ("page_size", "sliding_window_tokens", "full_pool_tokens", "swa_pool_tokens",
                     "chunked_prefill_size", "max_running_requests", "host_pool_tokens", "eviction_policy")


def recorded_settings(tr) -> tuple[list[str], dict, dict]:
    """(``key=value`` settings, incident dict, ``SGLANG_*`` switches) the trace was recorded with."""
    bj = Path(tr.path) / "backend.json"
    if bj.is_file():
        meta = json.loads(bj.read_text())
        sets = [f"{k}={v}" for k, v in (meta.get("settings") or {}).items()]
        return sets, meta.get("incident") or {}, dict(meta.get("env") or {})
    server = tr.manifest.get("server") or {}
    sets = [f"{k}={server[k]}" for k in SERVER_TO_SETTING if server.get(k) not in (None, "")]
    from replay.backends import dsv4

    if dsv4.is_dsv4(tr.path, tr.manifest):  # a DSV4 capture: the sizes its stack's facts give
        have = {s.split("=", 1)[0] for s in sets}
        sets += [f"{k}={v}" for k, v in dsv4.recorded_settings(tr.path, tr.manifest).items()
                 if k in DSV4_SETTINGS and k not in have]
    return sets, {}, {}


#: the knobs a DSV4 capture's rank facts complete (``replay.backends.dsv4.recorded_settings``)
DSV4_SETTINGS = ("kv_stack", "page_size", "sliding_window_tokens", "full_pool_tokens", "swa_pool_tokens",
                 "swa_full_tokens_ratio", "host_pool_tokens", "host_swa_pool_tokens")


def workload_rows(tr, rank: int = 0) -> list[dict]:
    t = tr.table("request", rank).to_pylist()
    rows = []
    for r in t:
        if r["event"] != "arrival":
            continue
        rows.append(dict(rid=int(r["rid"]), ts_ns=int(r["ts_ns"]), page_hashes=r["page_hashes"] or [],
                         input_len=int(r["input_len"]), output_len=int(r["output_len"]),
                         max_new_tokens=int(r["max_new_tokens"]), session_id=int(r["session_id"]),
                         turn=int(r["turn"])))
    return rows


def _said(run: dict) -> str:
    """``stable`` or ``growing (protected_prefix_pinned)``: a verdict and its cause when there is one."""
    return run["verdict"] + (f" ({run['primary_cause']})" if run.get("primary_cause") else "")


def on_code(code, sets: list[str], fix: list[str], incident: dict) -> tuple[list[str], list[str], dict, list[dict]]:
    """What of (recorded ``sets``, recommended ``fix``, planted ``incident``) ``code`` can take.

    Returns:
        (recorded sets kept: the sizes, :data:`replay.runs.code.CODE_KNOBS`; recommended sets kept;
        recommended switches: a recommended policy knob the code has its own switch for,
        :func:`replay.runs.code.code_switch`; ``not_applied``: the rest, each with why). A policy
        knob, a knob the fork cannot express and a planted bug are left out; a recorded policy knob
        at its default is left out silently (the code's own behaviour stands in for 0.5.23's default).
    """
    from replay import knobs
    from replay.runs.code import CODE_KNOBS, CODE_SWITCHES, FORK_REFUSED, code_switch

    defaults = knobs.defaults()

    def why(name: str) -> str:
        return FORK_REFUSED.get(name, "a policy knob: a commit is its own behaviour (no patch)")

    kept, not_applied = [], []
    for s in sets:
        name, _, value = s.partition("=")
        if name in CODE_KNOBS:
            kept.append(s)
        elif name in defaults and str(knobs.knob(name).parse(value)) != str(defaults[name]):
            not_applied.append({"recorded": s, "why": why(name)})
    fix_kept, switches = [], {}
    for s in fix:
        name, _, value = s.partition("=")
        switch = code_switch(code, name, value)
        if name in CODE_KNOBS:
            fix_kept.append(s)
        elif switch is not None:
            switches[switch[0]] = switch[1]
        else:
            mapped = any(k == name for k, _ in CODE_SWITCHES)
            not_applied.append({"recommended": s, "why": why(name) + (f"; {code.name} defines no switch for it"
                                                                         if mapped else "")})
    if incident:
        not_applied.append({"incident": incident.get("name"), "why": "bugs are planted in the installed sglang's "
                                                                     "classes; the code runs without it"})
    return kept, fix_kept, switches, not_applied


def replay_compare(tr, report, *, diagnose, progress: bool = False, verbose: bool = False, code=None,
                   env=()) -> dict:
    """Record the workload twice (recorded, recommended) and diagnose both runs with
    ``diagnose`` (``replay.diagnosis.doctor.doctor``, passed in: doctor calls this module).

    With nothing to change (no recommendation beyond the recorded settings and no planted bug)
    nothing is run; the summary says so.

    With ``code`` (a resolved :class:`replay.runs.code.Code` of its own process, or a spec) both
    runs are on that code, with the recorded sizes and switches and ``env`` (``K=V``) over them;
    what a code cannot take is left out (:func:`on_code`: ``not_applied``), so the recommended run
    applies the recommended ``SGLANG_*`` switches only, and runs when there are some. The
    recorded run always runs (whether the growth the trace shows is there on that code:
    ``growth_disappears_on_code``)."""
    from replay.backends.sglang import write_workload
    from replay.console import third_party_to_log
    from replay.diagnosis.make_incidents import sglang_switches
    from replay.record import record_workload
    from replay.runs.code import one_code, parse_env

    code = one_code(code, env) if code is not None or env else None
    code = None if code is None or code.installed else code
    sets, incident, env_rec = recorded_settings(tr)
    fix, fix_env = report.fix_sets, report.fix_env
    user_env = parse_env(env)
    out = {"recorded_sets": sets, "recommended_sets": fix, "recorded_env": env_rec, "recommended_env": fix_env,
           "incident": incident or None}
    if code is not None:
        sets, fix, switches, not_applied = on_code(code, sets, fix, incident)
        incident, fix_env = {}, {**fix_env, **switches}
        out |= {"code": code.as_dict(), "env": user_env, "not_applied": not_applied, "recorded_sets": sets,
                "recommended_sets": fix, "recommended_env": fix_env}
    if code is None and not fix and not fix_env and not incident:
        out.update(runs={}, growth_disappears=False,
                   summary="nothing replayed: no recommendation beyond the recorded settings")
        return out
    plan = [("recorded", sets, incident, {**env_rec, **user_env})]
    if code is None or fix or fix_env:
        plan.append(("recommended", sets + fix, {}, {**env_rec, **fix_env, **user_env}))
    log = None
    with tempfile.TemporaryDirectory() as tmp, third_party_to_log(None, verbose=verbose) as log:
        w = write_workload(Path(tmp) / "w", workload_rows(tr), hash_block_tokens=int(tr.manifest.get("hash_block_tokens") or 16))
        runs = {}
        for name, run_sets, inc, run_env in plan:
            dest = Path(tmp) / name
            if code is not None:
                record_workload(w, dest, overrides=tuple(run_sets), detail="counts", progress=progress, code=code,
                                env=run_env)
            else:
                with sglang_switches(run_env):
                    record_workload(w, dest, overrides=tuple(run_sets), detail="counts", progress=progress,
                                    incident=inc.get("name", ""), incident_every=int(inc.get("every", 7) or 7))
            d = diagnose(dest)
            runs[name] = {"verdict": d.verdict, "primary_cause": d.primary_cause,
                          "growth": {p: {k: g[k] for k in ("verdict", "slope_tokens_per_hour", "p_value")}
                                     for p, g in d.growth.items()},
                          "identity_violations": sum(v["rows"] for v in d.identity_violations),
                          "causes": [c["cause"] for c in d.causes]}
    out["runs"] = runs
    out["log"] = str(log.path) if log is not None and log.path else None
    if code is not None:
        _on_code_summary(out, report, code)
        if "recommended" not in runs:
            return out
    before, after = runs["recorded"], runs["recommended"]
    gone = (before["verdict"] != "stable" and after["verdict"] == "stable") or (
        report.primary_cause is not None and report.primary_cause not in after["causes"])
    out["growth_disappears"] = bool(gone)
    change = " ".join([f"--set {s}" for s in fix] + [f"{k}={v}" for k, v in fix_env.items()])
    out["summary"] = (out.get("summary", "") + f"recorded: {_said(before)}; recommended "
                      f"{change or '(the planted bug left out)'}: {_said(after)}; "
                      + ("the problem disappears" if gone else "the problem remains")
                      + (f"; sglang's log: {out['log']}" if out["log"] else ""))
    return out


def _on_code_summary(out: dict, report, code) -> None:
    """``growth_disappears_on_code`` (the trace's problem absent from the recorded run on the
    code) and the summary's opening: the code, what was left out, and (without a recommended run)
    why nothing more ran."""
    rec = out["runs"]["recorded"]
    found = report.verdict != "stable"
    out["growth_disappears_on_code"] = bool(found and (rec["verdict"] == "stable" or (
        report.primary_cause is not None and report.primary_cause not in rec["causes"])))
    left = [n.get("recorded") or n.get("recommended") or f"incident {n.get('incident')}" for n in out["not_applied"]]
    head = (f"on code {code.name} ({code.target}): the trace {_said({'verdict': report.verdict, 'primary_cause': report.primary_cause})}"
            + (f"; left out (a code's own behaviour): {', '.join(left)}" if left else "") + "; ")
    if "recommended" in out["runs"]:
        out["summary"] = head
        return
    out["growth_disappears"] = out["growth_disappears_on_code"]
    out["summary"] = (head + f"recorded on the code: {_said(rec)}; "
                      + ("the problem is not there on this code" if out["growth_disappears_on_code"] else
                         "the problem is there on this code" if found else "stable as the trace")
                      + "; no recommended run: no recommended SGLANG_* switch for a code to take"
                      + (f"; log: {out['log']}" if out["log"] else ""))
