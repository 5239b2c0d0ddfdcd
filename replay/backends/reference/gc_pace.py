"""The cyclic garbage collector's pace during a reference run.

A run allocates many long-lived containers (tree nodes, their page lists, every request's page
keys: ~16 M list entries over an hour of traffic) and makes almost no cyclic garbage (758
objects in all on ``production_1h``). CPython's default thresholds (700, 10, 10) start a young
collection every 700 net allocations, and each one walks the young lists entry by entry:
306 young, 28 middle and 2 full collections took 0.9 s of a 19 s figures-only replay of
``production_1h``; at (20000, 10, 10), 73 and 6 took 0.16 s. The run's own key table is built
at the same pace (the batched build at CPython's pace: 202 young, 18 middle and 2 full
collections, 0.35 s in all with the run; paced, 43 and 4 and no full one, 0.16 s). The
collector still runs (what little cycles a run makes are still freed), only less often; the
thresholds are restored when the run ends. Nothing a run decides depends on it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: allocations between young collections during a run (CPython's default: 700)
RUN_YOUNG_THRESHOLD = 20_000


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Young collections every :data:`RUN_YOUNG_THRESHOLD` allocations inside the block (never
    more often than the process had them); the process's thresholds restored after it."""
    saved = gc.get_threshold()
    if saved[0] > 0:  # 0: automatic collection is off; leave it so
        gc.set_threshold(max(saved[0], RUN_YOUNG_THRESHOLD), *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


__all__ = ["RUN_YOUNG_THRESHOLD", "fewer_collections"]
