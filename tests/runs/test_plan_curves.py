"""Notebook 07's curves (``replay.analysis.plan_curves``) on the bundled plan."""

from __future__ import annotations

from replay.analysis.plan_curves import knee, load_plan, plan_figure, plan_frame
from replay.paths import bundled


def test_bundled_plan_curves():
    plan = load_plan(bundled("plans/workload"))
    df = plan_frame(plan)
    assert df.height == 8 and df["swa_full_tokens_ratio"].to_list() == [0.05, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0]
    assert plan["best"]["swa_full_tokens_ratio"] == 0.25 and knee(plan)["swa_full_tokens_ratio"] == 0.25
    assert df.filter(~df["feasible"])["swa_full_tokens_ratio"].to_list() == [0.75, 1.0]  # aborts
    fig = plan_figure(plan)
    assert [t.name for t in fig.data] == ["prefix-hit ratio", "TTFT p99 (ms)"] and len(fig.data[0].x) == 8
    texts = [a.text for a in fig.layout.annotations]
    assert "recommended" in texts and any("bound" in t for t in texts)


def test_knee_before_the_best():
    rows = [{"swa_full_tokens_ratio": r, "prefix_hit_ratio": h, "feasible": True}
            for r, h in ((0.1, 0.5), (0.2, 0.995), (0.3, 1.0))]
    assert knee({"rows": rows})["swa_full_tokens_ratio"] == 0.2 and knee({"rows": []}) is None
