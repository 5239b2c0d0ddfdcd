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
# # 05 Policy A/B
# A sweep replays one workload under several policy presets (`kvtrace sweep`); each run is a
# trace plus `summary.json`. **Look at:** peak and mean SWA use, the prefix-hit ratio (a fix that
# frees SWA must not cost hits) and TTFT p99, then the SWA curves over time.

# %% tags=["parameters"]
import os

from replay.paths import bundled  # the bundled data, from any directory and an installed kvtrace

SWEEP = os.environ.get("KVTRACE_DATA", str(bundled("traces/ab")))

# %%
from replay.analysis import compare_runs, find_runs
from replay.report import figures as F

df = compare_runs(SWEEP)
df.select([c for c in ("run", "policy", "peak_swa_used", "mean_swa_used", "prefix_hit_ratio", "ttft_p99_ms",
                        "retractions") if c in df.columns])

# %%
F.compare_figure(SWEEP).show()

# %%
runs = {str(p.relative_to(SWEEP)): p for p in find_runs(SWEEP)}
F.overlay_figure(runs, pool="swa", title="SWA pool used, per run").show()
