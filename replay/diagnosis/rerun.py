"""``kvtrace doctor --replay``: re-run a trace's workload under the recorded settings and under the
recommended ones, on the real sglang backend, and say whether the growth disappears.

The workload is the trace's own ``request`` arrival rows. The recorded settings come from the
trace's ``backend.json`` (written by ``kvtrace record``) or, without it, from the manifest's
``server`` block. A planted bug named in ``backend.json`` (``incident``) is planted again in the
recorded run and left out of the recommended one (the fix). ``SGLANG_*`` switches the backend settings have no knob for
(``backend.json`` ``env``, and a recommendation's ``env``) are set around each run. Runs go
through ``replay.record.record_workload`` rather than ``replay.runs.replay_run``, which takes
``--set`` overrides only and so cannot carry the planted bug or those switches.
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
    return [f"{k}={server[k]}" for k in SERVER_TO_SETTING if server.get(k) not in (None, "")], {}, {}


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


def replay_compare(tr, report, *, progress: bool = False, verbose: bool = False) -> dict:
    """Record the workload twice (recorded, recommended) and diagnose both runs.

    With nothing to change (no recommendation beyond the recorded settings and no planted bug)
    nothing is run; the summary says so."""
    from replay.backends.sglang import write_workload
    from replay.console import third_party_to_log
    from replay.diagnosis.doctor import doctor
    from replay.diagnosis.make_incidents import sglang_switches
    from replay.record import record_workload

    sets, incident, env = recorded_settings(tr)
    fix, fix_env = report.fix_sets, report.fix_env
    out = {"recorded_sets": sets, "recommended_sets": fix, "recorded_env": env, "recommended_env": fix_env,
           "incident": incident or None}
    if not fix and not fix_env and not incident:
        out.update(runs={}, growth_disappears=False,
                   summary="nothing replayed: no recommendation beyond the recorded settings")
        return out
    log = None
    with tempfile.TemporaryDirectory() as tmp, third_party_to_log(None, verbose=verbose) as log:
        w = write_workload(Path(tmp) / "w", workload_rows(tr), hash_block_tokens=int(tr.manifest.get("hash_block_tokens") or 16))
        runs = {}
        for name, run_sets, inc, run_env in (("recorded", sets, incident, env),
                                             ("recommended", sets + fix, {}, {**env, **fix_env})):
            dest = Path(tmp) / name
            with sglang_switches(run_env):
                record_workload(w, dest, overrides=tuple(run_sets), detail="counts", progress=progress,
                                incident=inc.get("name", ""), incident_every=int(inc.get("every", 7) or 7))
            d = doctor(dest)
            runs[name] = {"verdict": d.verdict, "primary_cause": d.primary_cause,
                          "growth": {p: {k: g[k] for k in ("verdict", "slope_tokens_per_hour", "p_value")}
                                     for p, g in d.growth.items()},
                          "identity_violations": sum(v["rows"] for v in d.identity_violations),
                          "causes": [c["cause"] for c in d.causes]}
    out["runs"] = runs
    out["log"] = str(log.path) if log is not None and log.path else None
    before, after = runs["recorded"], runs["recommended"]
    gone = (before["verdict"] != "stable" and after["verdict"] == "stable") or (
        report.primary_cause is not None and report.primary_cause not in after["causes"])
    out["growth_disappears"] = bool(gone)
    change = " ".join([f"--set {s}" for s in fix] + [f"{k}={v}" for k, v in fix_env.items()])
    out["summary"] = (f"recorded: {_said(before)}; recommended "
                      f"{change or '(the planted bug left out)'}: {_said(after)}; "
                      + ("the problem disappears" if gone else "the problem remains")
                      + (f"; sglang's log: {out['log']}" if out["log"] else ""))
    return out
