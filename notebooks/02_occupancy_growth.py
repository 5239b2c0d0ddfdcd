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
# # 02 Occupancy growth
# Does occupancy come back down when load drops, or does it ratchet up? A growth incident is
# `held + protected` trending up across drains; a leak breaks
# `available + evictable + protected + held == capacity`.
# **Look at:** the SWA panel's protected + held floor over time, and the identity residual (must be 0).

# %% tags=["parameters"]
import os

from replay.paths import bundled  # the bundled data, from any directory and an installed kvtrace

TRACE = os.environ.get("KVTRACE_DATA", str(bundled("traces/ab/baseline")))
RESAMPLE = "2s"

# %%
import plotly.graph_objects as go
import polars as pl

from replay.analysis import occupancy
from replay.report import figures as F

occ = occupancy(TRACE, resample=RESAMPLE).collect()
occ.head()

# %%
F.occupancy_figure(TRACE, resample=RESAMPLE, title="Occupancy by component").show()

# %% [markdown]
# The occupancy identity per sample (non-zero = slots nobody accounts for):

# %%
resid = occ.drop_nulls("capacity").with_columns(
    residual=pl.col("capacity") - pl.col("available") - pl.col("evictable") - pl.col("protected") - pl.col("held"),
    pinned=pl.col("protected") + pl.col("held"))
fig = go.Figure()
for p in resid["pool"].unique().sort():
    d = resid.filter(pl.col("pool") == p)
    fig.add_trace(go.Scatter(x=d["t_s"], y=d["pinned"], name=f"{p} protected+held"))
    fig.add_trace(go.Scatter(x=d["t_s"], y=d["residual"], name=f"{p} identity residual", line={"dash": "dot"}))
fig.update_layout(title="Pinned slots and identity residual", xaxis_title="trace time (s)")
fig.show()
