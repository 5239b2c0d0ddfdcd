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
# An incident trace where SWA occupancy grows under multi-turn churn. Steps: diagnose it
# (`replay.diagnosis.doctor`: identity, growth trend, who holds SWA and why, which knob stops
# it), look at the holders, then compare with the replay of the same requests under the fix.
# **Look at:** the growth slope before vs after, and whether the prefix-hit ratio held.

# %% tags=["parameters"]
import os
from pathlib import Path

ROOT = Path(os.environ.get("KVTRACE_ROOT", Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()))
INCIDENT = os.environ.get("KVTRACE_DATA", str(ROOT / "data/traces/ab/baseline"))
FIXED = str(ROOT / "data/traces/ab/swa-fixes")
REPLAY = False  # True: also replay the incident under the recorded and the recommended settings (minutes)

# %%
import plotly.graph_objects as go
import polars as pl

from replay.analysis import holdings, prefix_hit_ratio
from replay.diagnosis.doctor import doctor
from replay.report import figures as F

report = doctor(INCIDENT, replay=REPLAY)
print(f"verdict: {report.verdict}   primary cause: {report.primary_cause}   "
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
fig.update_layout(title="Top SWA holders (slot-seconds)", yaxis={"autorange": "reversed"}, xaxis_title="slot-seconds")
fig.show() if top else print("no SWA holders attributed (no sliding window in this trace, or nothing held)")

# %% [markdown]
# **What would stop it.** The knobs the diagnosis recommends, as `kvtrace replay --set` arguments:

# %%
pl.DataFrame([{"cause": r["cause"], "set": " ".join(f"--set {k}" for k in r["sets"]), "why": r["text"]}
              for r in report.recommendations]) if report.recommendations else "no recommendation"

# %% [markdown]
# Sessions holding the most KV (slot-seconds in the full pool):

# %%
holdings(INCIDENT, by="session").head(10).collect()

# %% [markdown]
# **Before / after the fix.** The after run replays the incident's requests under `swa-fixes`
# (with another incident trace: `kvtrace replay TRACE --policy swa-fixes --out RUN`, or set
# `REPLAY = True` above to let the diagnosis replay it under the recommended knobs). Look at the
# level the SWA curve settles at and at the prefix-hit ratio below: the fix must not buy memory
# with hits.

# %%
pair = {"incident": INCIDENT, "fix": FIXED} if Path(FIXED).exists() and FIXED != INCIDENT else {"incident": INCIDENT}
F.overlay_figure(pair, pool="swa", column="used", title="SWA used: incident vs fix").show()
if report.replay:
    print(report.replay)
{k: round(prefix_hit_ratio(v), 4) for k, v in pair.items()}
