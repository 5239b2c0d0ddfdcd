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

# %% [markdown]
# ## SWA capacity curves: how large an SWA pool
# The split above moves memory between the pools at one budget. `kvtrace capacity SOURCE --pool swa
# --sizes ... --model NAME --out C` asks the other question: with the full pool fixed, what each SWA
# pool size gives (`replay.runs.capacity.capacity_sweep`: one reference replay per size, in
# parallel and resumable; docs/capacity.md "Capacity curves"). There is no one-pass curve for SWA
# (tombstones, window locks and admission decide what survives), so each point is a replay; the
# full pool's one-pass LRU hit ratio is drawn beside them as the bound the device hits stay under.
# **Look at:** where the hit ratio and TTFT p99 stop improving (the pool is no longer full: peak
# SWA used falls below the size line), and the hollow markers (sizes with retractions). The
# bundled curve is `data/workloads/mixed` at eight sizes (`--sizes 4096,...,65536 --model
# mellum-like-swa`, about 2 minutes here).

# %%
from replay.analysis.capacity_curves import capacity_figure, load_capacity

CAPACITY = os.environ.get("KVTRACE_CAPACITY", str(bundled("plans/capacity_mixed_swa")))
curve = load_capacity(CAPACITY)
curve.frame().select("size_tokens", "size_gb", "prefix_hit_ratio", "ttft_p99_ms", "retractions",
                     "peak_swa_used", "mean_swa_used", "one_pass_hit_ratio")

# %%
capacity_figure(curve).show()

# %% [markdown]
# One of those sizes replayed live (a few seconds): the same figures, since replay is exact and
# deterministic. Re-running the call resumes (completed sizes are not replayed).

# %%
import tempfile

from replay.runs.capacity import capacity_sweep

live_dir = tempfile.TemporaryDirectory(prefix="kvtrace-capacity-")  # removed when this kernel ends
live = capacity_sweep(bundled("workloads/mixed"), live_dir.name + "/swa",
                      pool="swa", sizes_tokens=[16384], model="mellum-like-swa", jobs=1)
for r in live.rows:
    print(f"{r['size_tokens']:>6,} tokens ({r['size_gb']:.3f} GB): hit {r['prefix_hit_ratio']:.4f}, "
          f"TTFT p99 {r['ttft_p99_ms']:,.0f} ms, peak SWA {r['peak_swa_used']:,}; bundled hit "
          f"{curve.row(r['size_tokens'])['prefix_hit_ratio']:.4f}")
