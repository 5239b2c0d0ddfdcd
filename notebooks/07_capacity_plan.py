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
# # 07 Capacity plan: how to split the KV memory
# `kvtrace plan TRACE --kv-gb X --model NAME --out P` replays the trace at each full/SWA split of
# one device budget (`swa_full_tokens_ratio`; docs/capacity.md) and recommends the best split that
# finishes every request without retractions. **Look at:** where the prefix-hit ratio peaks (too
# little SWA: admissions starve and nothing stays cached; too much: the full pool is too small to
# keep the prefixes), the knee (the smallest SWA share that gets within 1 % of the best), the
# recorded setting, and the TTFT p99 on the right axis. Hollow markers: splits with retractions
# or aborts. The grey line is the full pool's one-pass LRU bound: no split can beat it.

# %% tags=["parameters"]
import os

from replay.paths import bundled  # the bundled data, from any directory and an installed kvtrace

PLAN = os.environ.get("KVTRACE_DATA", str(bundled("plans/workload")))

# %%
from replay.analysis.plan_curves import knee, load_plan, plan_figure, plan_frame

plan = load_plan(PLAN)
plan_frame(plan)

# %%
best, k = plan["best"], knee(plan)
print("recommended:", " ".join(plan["server_args"]) if best else "none (raise --kv-gb)")
print("knee: ratio", k["swa_full_tokens_ratio"] if k else None, "| recorded ratio:", plan.get("recorded_ratio"))

# %%
plan_figure(plan).show()
