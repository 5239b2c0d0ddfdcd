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

# %%
import json

import polars as pl

from replay.analysis import holdings, prefix_hit_ratio
from replay.report import figures as F

try:
    from replay.diagnosis.doctor import doctor
    diag = doctor(INCIDENT).to_dict()
    print(json.dumps(diag, indent=1, default=str)[:3000])
except ImportError:
    diag = None

# %% [markdown]
# Sessions holding the most KV (slot-seconds in the full pool):

# %%
holdings(INCIDENT, by="session").head(10).collect()

# %% [markdown]
# Before / after the fix (the after run replays the incident's requests under `swa-fixes`;
# with another incident trace, produce it with `kvtrace replay TRACE --policy swa-fixes --out RUN`).

# %%
pair = {"incident": INCIDENT, "fix": FIXED} if Path(FIXED).exists() and FIXED != INCIDENT else {"incident": INCIDENT}
F.overlay_figure(pair, pool="swa", column="used", title="SWA used: incident vs fix").show()
{k: round(prefix_hit_ratio(v), 4) for k, v in pair.items()}
