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
# # 05 Policy A/B (and code A/B)
# A sweep replays one workload under several policy presets (`kvtrace sweep`); each run is a
# trace plus `summary.json`. A sweep made with `--code pre=A,post=B` has a `code=` level too:
# `code` is then a dimension like `policy` (each code on its own process; the base is the first
# `--code`). **Look at:** peak and mean SWA use, the prefix-hit ratio (a fix that frees SWA must
# not cost hits), TTFT p99 and, across codes, finished requests and shrunk admissions, then the
# SWA curves over time.

# %% tags=["parameters"]
import os

from replay.paths import bundled  # the bundled data, from any directory and an installed kvtrace

SWEEP = os.environ.get("KVTRACE_DATA", str(bundled("traces/ab")))

# %%
from replay.analysis import compare_runs, find_runs
from replay.report import figures as F
from replay.report.codes import code_axis

df = compare_runs(SWEEP)
axis = code_axis(SWEEP)  # None unless the sweep has a code= level
dims = [c for c in ("code", "policy") if c in df.columns]
df.select([c for c in ("run", *dims, "peak_swa_used", "mean_swa_used", "prefix_hit_ratio", "ttft_p99_ms",
                        "retractions") if c in df.columns])

# %% [markdown]
# With a `code=` level: one row per figure and (policy, grid point), one column per code, and each
# code's change against the base code at the same point (`<code>_delta`).

# %%
axis.table() if axis is not None else "no code= level: the runs differ by policy (and grid) only"

# %%
if axis is not None:
    F.code_figure(axis, title=f"Codes side by side (base {axis.base})").show()

# %%
F.compare_figure(SWEEP).show()

# %%
runs = {str(p.relative_to(SWEEP)): p for p in find_runs(SWEEP)}
F.overlay_figure(runs, pool="swa", title="SWA pool used, per run").show()
