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
# # 04 Host allocator CPU
# With HiCache, every host free either concatenates onto the whole host free list (`eager_cat`,
# O(pool size) per free) or appends a chunk merged lazily (`lazy_merge`). This notebook puts the
# two side by side. **Look at:** the free-op duration growing with the free-list size under
# `eager_cat`, and the share of step time the allocator takes.

# %% tags=["parameters"]
import os
from pathlib import Path

from replay.paths import bundled  # the bundled data, from any directory and an installed kvtrace

BEFORE = os.environ.get("KVTRACE_DATA", str(bundled("traces/ab/baseline")))
# the "after" trace: KVTRACE_AFTER, else the bundled fix of the bundled default (never a trace
# unrelated to the one you named)
AFTER = os.environ.get("KVTRACE_AFTER") or (str(bundled("traces/ab/swa-fixes")) if "KVTRACE_DATA" not in os.environ else "")

# %%
import plotly.graph_objects as go
import polars as pl

from replay.analysis import host_allocator_cpu
from replay.report import figures as F

runs = {"before": BEFORE, "after": AFTER} if AFTER and Path(AFTER).exists() and AFTER != BEFORE else {"trace": BEFORE}
per_op = pl.concat([host_allocator_cpu(p, pools=None).per_op.collect().with_columns(run=pl.lit(k))
                    for k, p in runs.items()])
per_op

# %%
F.allocator_cpu_figure(BEFORE, pools=None, title="Allocator op durations (before)").show()

# %%
fig = go.Figure()
for k, p in runs.items():
    s = host_allocator_cpu(p, pools=None).per_step.collect()
    fig.add_trace(go.Histogram(x=s["share_of_step"] * 100, name=k, opacity=0.6, nbinsx=50))
fig.update_layout(barmode="overlay", title="Allocator share of step time (%)", xaxis_title="% of step")
fig.show()
