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
# # 03 Churn
# How many tokens the allocators hand out and take back per second, and when the tree evicts
# in bursts. **Look at:** eviction bursts (red) lining up with allocation spikes: that is the
# cache thrashing; retractions mean decode ran out of memory.

# %% tags=["parameters"]
import os

from replay.paths import bundled  # the bundled data, from any directory and an installed kvtrace

TRACE = os.environ.get("KVTRACE_DATA", str(bundled("traces/ab/baseline")))
WINDOW = "1s"

# %%
import plotly.express as px
import polars as pl

from replay.analysis import churn
from replay.report import figures as F

ch = churn(TRACE, window=WINDOW).collect()
ch.group_by("pool").agg(pl.col("alloc_tokens", "free_tokens", "evicted_tokens", "tombstones").sum())

# %%
F.churn_figure(TRACE, window=WINDOW).show()

# %%
fig = px.scatter(ch.filter(pl.col("evicted_tokens") > 0), x="t_s", y="evicted_tokens", color="eviction_burst",
                 facet_row="pool", title="Eviction windows (bursts: > 3x the pool's mean)")
fig.show()
