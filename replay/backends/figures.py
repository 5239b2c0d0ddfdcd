"""Figures-only runs (``detail="figures"``): a replay's summary figures computed from its events
as they are emitted, with no trace written.

A plan or capacity sweep reads one ``summary.json`` per split; writing each split's trace (an
hour of traffic: ~5.7 rows a step, ~850,000 rows for production_1h's first 4,000 arrivals) only
to read those figures back costs about a quarter of the replay's CPU. :class:`FigureSink` takes
the tracer's emits instead of a recorder (``tracer.route``) and keeps exactly what
:func:`replay.runs.metrics.trace_metrics` and :func:`replay.runs.kv_gb.gb_figures` read from the
rows: arrival and finish counts and sums, each pool's ``stats`` samples (trace clock, used), the
``cache`` evict and SWA-release sums, each request's last match's host hit, retractions and the
host pools' allocator CPU. :func:`replay.runs.metrics.sink_metrics` turns them into the figures
through the same functions as a trace's (:func:`replay.runs.metrics.occupancy_figures`,
:func:`replay.runs.kv_gb.pool_usage`), so a
figures-only run's summary equals the traced run's, figure for figure (measured CPU aside;
``tests/runs/test_figures_only.py``). A trace's rows carry the clock set last (``set_clock``,
the manual clock of a replay); so do the samples here.

What a figures-only run cannot give is what needs the rows: ``kvtrace report``'s evidence,
``diff``, ``doctor``. Its summary says ``traced: false``.
"""

from __future__ import annotations

from array import array

from tracer.schema import CacheOp, Pool, PoolOp, RequestEvent, SchedKind

_POOL_NAMES = {int(Pool.FULL): "full", int(Pool.SWA): "swa", int(Pool.HOST_FULL): "host_full",
               int(Pool.HOST_SWA): "host_swa"}


class FigureSink:
    """The tracer's emits, aggregated into a run's summary figures (see the module docstring).

    ``emits()`` gives the functions to route the tracer to; the attributes, :meth:`series` and
    :meth:`host_hit_of_finished` what was kept. Not thread-safe: one replay loop emits into it.
    """

    def __init__(self) -> None:
        self.clock_ns = 0
        self.arrivals = 0
        self.finished = 0
        self.finished_input = 0  # sum(input_len) of finish rows
        self.finished_output = 0  # sum(max(output_len, 0)) of finish rows
        self.known_input = 0  # of finish rows with cached_len >= 0
        self.known_cached = 0
        self.finished_rids: list[int] = []
        self.last_host_hit: dict[int, int] = {}  # rid -> host_hit of its last match row
        self.swa_evicted = 0
        self.swa_released = 0
        self.retractions = 0
        self.host_alloc_ns = 0
        self.host_free_ns = 0
        self._host_prev: dict[int, int] = {}  # host pool -> its last alloc/free/merge op
        # pool -> (ts_ns samples, used samples), and pool -> largest capacity sampled
        self.samples: dict[int, tuple[array, array]] = {}
        self.capacity: dict[int, int] = {}

    # ---- the emits ---------------------------------------------------------------------------

    def emits(self) -> dict:
        """Functions with the tracer's emit signatures (``tracer.route``)."""
        sink = self
        samples, capacity = self.samples, self.capacity
        host = (int(Pool.HOST_FULL), int(Pool.HOST_SWA))
        alloc, free, merge = int(PoolOp.ALLOC), int(PoolOp.FREE), int(PoolOp.MERGE)
        evict, release, match = int(CacheOp.EVICT), int(CacheOp.SWA_RELEASE), int(CacheOp.MATCH)
        retract = int(SchedKind.RETRACT)
        arrival, finish = int(RequestEvent.ARRIVAL), int(RequestEvent.FINISH)
        host_prev = self._host_prev
        last_host_hit = self.last_host_hit

        def set_clock(ts_ns):
            t = sink.clock_ns = int(ts_ns)
            return t

        def tick():
            return sink.clock_ns

        def pool(pool, op, rid, num_slots, num_pages=0, dur_ns=0):
            if pool in host and (op == alloc or op == free or op == merge):
                prev = host_prev.get(pool)
                host_prev[pool] = op
                if op == alloc:
                    sink.host_alloc_ns += dur_ns
                elif op == free or prev == free:  # a merge right after a free is that free's cost
                    sink.host_free_ns += dur_ns

        def pool_ids(pool_, op, rid, num_slots, num_pages=0, dur_ns=0, page_ids=None):
            pool(pool_, op, rid, num_slots, num_pages, dur_ns)

        def cache(op, rid, device_hit=0, host_hit=0, swa_host_hit=0, full_tokens=0, swa_tokens=0,
                  host_tokens=0, nodes=0, tombstones=0, dur_ns=0):
            if op == evict:
                sink.swa_evicted += swa_tokens
            elif op == release:
                sink.swa_released += swa_tokens
            elif op == match and rid >= 0:
                last_host_hit[rid] = host_hit

        def sched(kind, forward_ct, mode=0, batch_size=0, num_tokens=0, step_ns=0, rid=-1, prefix_len=0,
                  extend_len=0, host_hit_len=0, chunk_requested=0, chunk_admitted=0, verdict=0,
                  rem_total=-1, rem_swa=-1, swa_needed=-1):
            if kind == retract:
                sink.retractions += 1

        def stats(forward_ct, pool, capacity_, available, evictable, protected, held):
            s = samples.get(pool)
            if s is None:
                s = samples[pool] = (array("q"), array("q"))
                capacity[pool] = capacity_
            s[0].append(sink.clock_ns)
            s[1].append(capacity_ - available)
            if capacity_ > capacity[pool]:
                capacity[pool] = capacity_

        def request(event, rid, session_id=-1, turn=-1, input_len=0, output_len=-1, max_new_tokens=0,
                    cached_len=-1, rid_str="", page_hashes=None, prefix_rid=-1, prefix_blocks=0,
                    new_blocks=-1, tip_hash=0):
            if event == arrival:
                sink.arrivals += 1
            elif event == finish:
                sink.finished += 1
                sink.finished_rids.append(rid)
                sink.finished_input += input_len
                sink.finished_output += max(output_len, 0)
                if cached_len >= 0:
                    sink.known_input += input_len
                    sink.known_cached += cached_len

        return {"pool": pool, "pool_ids": pool_ids, "cache": cache, "sched": sched, "stats": stats,
                "request": request, "tick": tick, "set_clock": set_clock}

    def device_series(self, pool: int, capacity: int) -> tuple[array, array]:
        """The (trace clock, used) sample arrays of ``pool`` (created, and its capacity noted, as
        its first ``stats`` row would), for a loop that samples a pool of fixed ``capacity``
        itself: a ``stats`` row of it at clock ``t`` with ``available`` free is ``t`` appended
        to the first and ``capacity - available`` to the second."""
        s = self.samples.get(pool)
        if s is None:
            s = self.samples[pool] = (array("q"), array("q"))
            self.capacity[pool] = capacity
        elif capacity > self.capacity[pool]:
            self.capacity[pool] = capacity
        return s

    # ---- what was kept ----------------------------------------------------------------------

    def series(self) -> dict:
        """Each pool's samples in emission (``seq``) order: ``{name: (ts_ns, used, largest
        capacity)}`` (``full``, ``swa``, ``host_full``, ``host_swa``; pools never sampled absent)."""
        return {_POOL_NAMES[p]: (ts, used, self.capacity[p]) for p, (ts, used) in self.samples.items()
                if p in _POOL_NAMES}

    def host_hit_of_finished(self) -> int:
        """Sum over finished requests of their last match's host hit."""
        return sum(self.last_host_hit.get(r, 0) for r in set(self.finished_rids))


__all__ = ["FigureSink"]
