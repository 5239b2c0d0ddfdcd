"""One colour per pool, per pool state and per run, and one line style per allocator op, shared by
every figure of the report and the notebooks (so "swa" is the same colour everywhere)."""

from __future__ import annotations

#: pool -> colour (Okabe-Ito, distinguishable with colour-blindness)
POOL_COLORS = {"full": "#0072B2", "swa": "#E69F00", "host_full": "#009E73", "host_swa": "#CC79A7",
               "req_to_token": "#56B4E9"}
#: pool state (occupancy stack) -> colour, none of them a pool colour
STATE_COLORS = {"held": "#D55E00", "protected": "#7F4F9F", "evictable": "#8FBF6F", "used": "#333333"}
CAPACITY_COLOR = "#000000"
#: allocator/cache op -> line dash (the colour is the pool's)
OP_DASH = {"alloc": "solid", "free": "dash", "evict": "dot", "evicted": "dot", "tombstone": "dashdot"}
#: runs / compared traces, in order (distinct from the pool colours)
RUN_COLORS = ("#1B9E77", "#D95F02", "#7570B3", "#E7298A", "#66A61E", "#A6761D", "#666666", "#E6AB02")
#: dashes for series that may coincide exactly (the later ones stay visible over the earlier)
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def pool_color(pool: str) -> str:
    return POOL_COLORS.get(pool, "#444444")


def run_style(i: int) -> dict:
    """Line style of the i-th run: its colour, a dash and a width that shrinks, so identical
    curves stay visible on top of each other."""
    return {"color": RUN_COLORS[i % len(RUN_COLORS)], "dash": DASHES[i % len(DASHES)],
            "width": max(1.0, 3.5 - 0.6 * i)}
