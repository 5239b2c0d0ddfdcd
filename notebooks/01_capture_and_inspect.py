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
# # 01 Capture and inspect
# A trace is a directory of Parquet families (`request`, `sched`, `cache`, `pool`, `stats`,
# `drops`). This notebook opens one, lists what it holds, and draws its pool occupancy.
# **Look at:** the row counts (a capture with no `stats` rows cannot show occupancy), the drops
# (losses are never silent), and whether `held` returns to 0 when the server drains.

# %% tags=["parameters"]
import os

from replay.paths import bundled  # the bundled data, from any directory and an installed kvtrace

TRACE = os.environ.get("KVTRACE_DATA", str(bundled("traces/ab/baseline")))

# %%
import json

import polars as pl

from replay.report import figures as F
from replay.trace import open_trace

tr = open_trace(TRACE)
print(json.dumps(tr.manifest.get("server", {}), indent=1))
pl.DataFrame({"family": ["request", "sched", "cache", "pool", "stats", "drops"],
              "rows": [tr.rows(f) for f in ("request", "sched", "cache", "pool", "stats", "drops")]})

# %% [markdown]
# Recorded losses (an empty table is what you want):

# %%
tr.lazy("drops").collect()

# %% [markdown]
# Occupancy: held (request-private), protected (locked in the tree) and evictable (cached,
# unlocked) slots, stacked under the pool capacity.

# %%
fig = F.occupancy_figure(tr, resample="1s")
fig.show()
