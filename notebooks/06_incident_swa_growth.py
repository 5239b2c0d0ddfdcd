# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 Incident: SWA growth
# An incident trace where SWA occupancy grows. Steps: diagnose it (`replay.diagnosis.doctor`:
# identity, growth trend, who holds SWA and why, which knob stops it), look at the holders, then
# **replay the same trace** under its recorded settings and under the doctor's recommendation
# (`replay.report.proof.replayed_proof`, the reference backend: about a second on the bundled
# incidents), or read the fixed run you name in `FIXED_RUN`.
# **Look at:** the growth verdict before vs after, and whether the prefix-hit ratio held.

# %% tags=["parameters"]
import os

from replay.paths import bundled  # the bundled data, from any directory and an installed kvtrace

INCIDENT = os.environ.get("KVTRACE_DATA", str(bundled("incidents/private_range_kept")))
FIXED_RUN = os.environ.get("KVTRACE_FIXED_RUN", "")  # a run of the SAME requests under the fix ("" = replay it here)
BACKEND = "reference"  # backend of the replays ("sglang": the real classes, slower)

# %%
import tempfile

import plotly.graph_objects as go
import polars as pl

from replay.analysis import holdings
from replay.diagnosis.doctor import doctor
from replay.report import figures as F
from replay.report.proof import PROOF_METRICS, replayed_proof, trace_column

report = doctor(INCIDENT)
print(f"verdict: {report.verdict}   primary cause: {report.primary_cause or 'none'}   "
      f"identity violations: {len(report.identity_violations)}")
pl.DataFrame([{"pool": pool, **{k: g.get(k) for k in ("verdict", "slope_tokens_per_hour", "p_value",
                                                       "first_tokens", "last_tokens", "capacity", "hours_to_exhaustion")}}
              for pool, g in report.growth.items()])

# %% [markdown]
# **Who holds the SWA pool, and why.** Each bar is one holder (tree nodes a request inserted, a
# request's own slots, ...) sized by slot-seconds, coloured by the cause the diagnosis attributes
# it to. A few requests holding most of the pool points at one policy; many small holders at churn.

# %%
top = report.holders[:15]
fig = go.Figure()
for cause in dict.fromkeys(h["cause"] for h in top):
    rows = [h for h in top if h["cause"] == cause]
    fig.add_bar(x=[h["slot_seconds"] for h in rows], y=[h["holder"] for h in rows], name=cause, orientation="h")
fig.update_layout(title="Top SWA holders", yaxis={"autorange": "reversed", "title": "holder"},
                  xaxis_title="SWA slot-seconds held outside the window (slot·s)")
fig.show() if top else print("no SWA holders attributed (no sliding window in this trace, or nothing held)")

# %% [markdown]
# **What would stop it.** The knobs the diagnosis recommends, as `kvtrace replay --set` arguments:

# %%
pl.DataFrame([{"cause": r["cause"], "set": " ".join(f"--set {k}" for k in r["sets"]) or "(no knob)", "why": r["text"]}
              for r in report.recommendations]) if report.recommendations else "no recommendation"

# %% [markdown]
# Sessions holding the most KV (slot-seconds in the full pool):

# %%
holdings(INCIDENT, by="session").head(10).collect()

# %% [markdown]
# **Before / after the fix, on the same requests.** Without `FIXED_RUN`, the incident is replayed
# twice: under its recorded settings (the control: do the settings alone reproduce it?) and with
# the recommended `--set` knobs added. With `FIXED_RUN`, that run is read instead (it must replay
# this trace's requests, e.g. `kvtrace replay INCIDENT --set ... --out RUN`). Look at the SWA level
# and at the prefix-hit ratio: the fix must not buy memory with hits.

# %%
# the replays go to a temporary directory, removed when this kernel ends
work_dir = tempfile.TemporaryDirectory(prefix="kvtrace-nb06-")
work = work_dir.name
if FIXED_RUN:
    columns = [trace_column(INCIDENT), trace_column(FIXED_RUN, label="fixed run")]
    conclusion = f"{columns[0].verdict} as recorded, {columns[1].verdict} in {FIXED_RUN}"
else:
    proof = replayed_proof(INCIDENT, report, work, backend=BACKEND)
    columns, conclusion = proof.columns, proof.conclusion
print(conclusion)
pl.DataFrame([{"": c.label, "verdict": c.verdict, **{m: c.metrics.get(m) for m in PROOF_METRICS}} for c in columns])

# %%
F.overlay_figure({c.label: c.path for c in columns}, pool="swa", resample="250ms",
                 title="SWA used: recorded vs replayed").show()
