"""``capacity_curve``: device prefix-hit ratio as a function of full-pool capacity, in ONE pass.

Model. Requests touch their prompt pages (page hashes at the page size) when they are matched
(arrival order) and insert their prompt + output pages when they finish. Output pages have no
hashes of their own; they are the pages of the next turn of the same session that extend the
prompt (when that turn starts with the whole prompt). Under LRU, a page is cached in a pool of
C pages exactly when fewer than C distinct pages were touched more recently (its *stack
distance*), and LRU's inclusion property makes one pass give the answer for every C. A radix
tree evicts leaves first, so a page counts as a hit only if all its ancestors do: per request the
hit pages are the leading pages whose running maximum of stack distance is < C. SGLang matches
at most ``input_len - 1`` tokens, page-aligned.

What the model leaves out (see docs/analysis.md for the measured agreement): the pool also
holds the private KV of running requests (so the cache gets less than C), locked pages cannot be
evicted, and the match happens at admission rather than arrival.

SWA occupancy has no such curve: whether an SWA page survives depends on tombstoning, window
locks and admission decisions that change with the pool size, not on an access order that is
fixed in advance; kvtrace replays each size instead (:func:`replay.runs.capacity.capacity_sweep`,
``kvtrace capacity --pool swa|host``), with this curve beside it as the full pool's fast bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replay.analysis._base import as_trace, page_size_of

_NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class CapacityCurve:
    """Hit ratio at ``capacity_tokens`` (arrays); ``at()``/``capacity_for()`` are exact."""

    capacity_tokens: np.ndarray
    hit_ratio: np.ndarray
    page_size: int
    requests: int
    prompt_tokens: int
    distinct_pages: int
    pool: str = "full"
    policy: str = "lru"
    stack_pages: np.ndarray = field(default=None, repr=False)  # sorted per-page running max

    def at(self, capacity_tokens: int) -> float:
        """Predicted device prefix-hit ratio with a pool of ``capacity_tokens``."""
        pages = int(capacity_tokens) // self.page_size
        hits = int(np.searchsorted(self.stack_pages, pages, side="left"))
        return hits * self.page_size / self.prompt_tokens if self.prompt_tokens else 0.0

    def capacity_for(self, hit_ratio: float) -> int | None:
        """Smallest capacity (tokens, page-aligned) reaching ``hit_ratio``; None if unreachable."""
        need = int(np.ceil(hit_ratio * self.prompt_tokens / self.page_size))
        if need <= 0:
            return 0
        finite = self.stack_pages[self.stack_pages < _NEVER]
        if need > len(finite):
            return None
        return (int(finite[need - 1]) + 1) * self.page_size

    def frame(self):
        """Polars DataFrame ``capacity_tokens, hit_ratio``."""
        import polars as pl

        return pl.DataFrame({"capacity_tokens": self.capacity_tokens, "hit_ratio": self.hit_ratio})


def capacity_curve(trace_or_workload, pool: str = "full", policy: str = "lru",
                   page_size: int | None = None, capacities_tokens=None) -> CapacityCurve:
    """One-pass LRU capacity curve of the full device pool.

    The SWA and host pools have no one-pass curve: ``pool="swa"``/``"host"`` is refused naming
    :func:`replay.runs.capacity.capacity_sweep` (``kvtrace capacity``), which replays each size
    (that module reads this one for the bound, so this one does not call it).

    Args:
        trace_or_workload: a trace, run or workload directory (only its ``request`` rows are read).
        pool: only ``"full"``; ``"swa"``/``"host"`` are refused (use ``capacity_sweep``).
        policy: only ``"lru"`` (stack distances need an eviction order with the inclusion property).
        page_size: default the trace's server page size (workloads: their hash block).
        capacities_tokens: grid for the arrays (default: 64 log-spaced sizes up to the footprint).
    """
    if pool != "full":
        raise ValueError(f"pool={pool!r}: a one-pass capacity curve exists only for the full pool; "
                         "SWA occupancy depends on tombstones, window locks and admission (and the host "
                         "pool on the device pool's evictions), so replay each size: "
                         "replay.runs.capacity.capacity_sweep(source, out, pool='swa'|'host', ...) or "
                         "kvtrace capacity --pool swa|host (docs/capacity.md, 'Capacity curves')")
    if policy != "lru":
        raise ValueError(f"policy={policy!r}: only 'lru' has the inclusion property one-pass "
                         "stack distances need; replay other policies at each size")
    t = as_trace(trace_or_workload)
    ps = page_size_of(t, page_size)
    hb = int(t.manifest.get("hash_block_tokens") or ps)
    if ps % hb:
        raise ValueError(f"page_size={ps} is not a multiple of hash_block_tokens={hb}")
    reqs, n_ids = _load(t, ps // hb)
    events, usable, prompt_tokens = _events(reqs, ps)
    stack, distinct = _stack_pass(events, usable, n_ids)
    if capacities_tokens is None:
        top = max(distinct, 1) * ps
        capacities_tokens = np.unique(np.geomspace(ps, top * 1.05, 64).astype(np.int64) // ps * ps)
    caps = np.asarray(capacities_tokens, dtype=np.int64)
    hits = np.searchsorted(stack, caps // ps, side="left") * ps
    ratio = hits / prompt_tokens if prompt_tokens else np.zeros(len(caps))
    return CapacityCurve(caps, ratio, ps, len(reqs), prompt_tokens, distinct, pool, policy, stack)


def _load(t, k: int) -> tuple[list[dict], int]:
    """Requests in arrival order with their pages as dense page ids (0..n-1, one per distinct
    page hash; every k-th hash block is a page), and n. Column-wise: the hash lists are
    flattened once (Arrow) and ranked once (Polars), each request keeps a view."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.compute as pc

    req = t.lazy("request").with_columns(pl.col("event").cast(pl.String))
    arr = (req.filter(pl.col("event") == "arrival")
           .select("rid", "seq", "ts_ns", "session_id", "input_len", "output_len", "page_hashes"))
    ends = (req.filter(pl.col("event").is_in(("finish", "abort")))
            .select("rid", pl.col("ts_ns").alias("end_ns"), pl.col("output_len").alias("out_done")))
    df = arr.join(ends, on="rid", how="left").sort("ts_ns", "seq").collect()
    lists = df["page_hashes"].to_arrow()
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    blocks = np.asarray(lists.flatten().to_numpy(zero_copy_only=False), dtype=np.uint64)
    lens = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(lens)))
    counts = lens // k
    if k == 1:
        pages = blocks
    else:
        pages = blocks[np.concatenate([np.arange(o + k - 1, o + n, k, dtype=np.int64)
                                       for o, n in zip(starts[:-1], lens)] or [np.zeros(0, np.int64)])]
    ids, n_ids = _dense_ids(pages)
    poff = np.concatenate(([0], np.cumsum(counts)))
    out = []
    cols = [df[c].to_list() for c in ("ts_ns", "end_ns", "session_id", "input_len", "output_len", "out_done")]
    for i, (ts, end, session, inp, outp, done) in enumerate(zip(*cols)):
        out_len = done if done is not None and done >= 0 else max(outp, 0)
        out.append({"ts": ts, "end": end, "session": session, "input_len": int(inp),
                    "output_len": int(out_len), "pages": ids[poff[i]:poff[i + 1]]})
    return out, n_ids


def _events(reqs: list[dict], ps: int):
    """(ts, order, pages, request index or -1) events: match at arrival, insert at finish."""
    next_in_session: dict[int, int] = {}
    nxt = [None] * len(reqs)
    for i in range(len(reqs) - 1, -1, -1):
        s = reqs[i]["session"]
        if s is not None and s >= 0:
            nxt[i] = next_in_session.get(s)
            next_in_session[s] = i
    events, usable, prompt = [], [], 0
    for i, r in enumerate(reqs):
        pages = r["pages"]
        prompt += r["input_len"]
        usable.append(min(len(pages), max(r["input_len"] - 1, 0) // ps))
        ins = pages
        j = nxt[i]
        if j is not None:
            np_ = reqs[j]["pages"]
            n = len(pages)
            if len(np_) > n and (n == 0 or np_[n - 1] == pages[-1]):
                ins = np_[: max(n, min(len(np_), (r["input_len"] + r["output_len"]) // ps))]
        end = r["end"] if r["end"] is not None else r["ts"]
        events.append((r["ts"], 2 * i, pages, i))
        events.append((end, 2 * i + 1, ins, -1))
    events.sort(key=lambda e: (e[0], e[1]))
    return events, usable, prompt


def _stack_pass(events, usable, n_ids: int | None = None) -> tuple[np.ndarray, int]:
    """Sorted running-max stack distances (pages) of every usable prompt page of every match,
    and the number of distinct pages. ``events``' pages are hashes, or dense ids in
    ``0..n_ids-1`` (all touched) when ``n_ids`` is given.

    ``cnt[x]`` is the number of pages whose last touch is event ``x``; the pages touched more
    recently than a page last touched at ``p`` number ``live - prefix(p)``. The prefix sums come
    from a Fenwick tree over event indices, updated and queried at the distinct event indices
    of an event's pages, so the pass is O(touches + distinct x log events) rather than
    O(events^2)."""
    if not events:
        return np.zeros(0, np.int64), 0
    sizes = np.fromiter((len(e[2]) for e in events), np.int64, len(events))
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    if n_ids is None:
        dense, distinct = _dense_ids(np.concatenate([e[2] for e in events]).astype(np.uint64, copy=False))
    else:
        dense, distinct = None, int(n_ids)
    last = np.full(max(distinct, 1), -1, np.int64)
    cnt = np.zeros(len(events) + 1, np.int64)
    tree = _Fenwick(len(events) + 1)
    live = 0  # pages with a last touch so far (Σ cnt)
    out = []
    for e, (_, _, pages, ridx) in enumerate(events):
        ids = pages if dense is None else dense[offsets[e]:offsets[e + 1]]
        prev = last[ids]
        if ridx >= 0:
            u = usable[ridx]
            if u:
                p = prev[:u]
                seen = p >= 0
                d = np.full(u, _NEVER, np.int64)
                if seen.any():
                    ps_ = p[seen]
                    # pages whose last touch is after prev (strictly), plus the ancestors touched
                    # in the same event (a leaf-first LRU refreshes ancestors last).
                    at, n = _runs(ps_, sort=False)  # runs of equal event indices, in order
                    newer = np.repeat(live - tree.prefix(at), n)
                    d[seen] = newer + np.minimum(np.nonzero(seen)[0], cnt[ps_])
                out.append(np.maximum.accumulate(d))
        valid = prev[prev >= 0]
        if len(valid):
            at, n = _runs(valid)
            cnt[at] -= n
            tree.add(at, -n)
            live -= len(valid)
        if len(ids):
            cnt[e] += len(ids)
            tree.add(np.array([e]), np.array([len(ids)], np.int64))
            live += len(ids)
        last[ids] = e
    if not out:
        return np.zeros(0, np.int64), distinct
    return np.sort(np.concatenate(out)), distinct


def _dense_ids(pages: np.ndarray) -> tuple[np.ndarray, int]:
    """0-based dense ids of page hashes (sorted order, as ``np.unique(return_inverse=True)``)
    and the number of distinct pages; Polars' multi-threaded dense rank is ~2.5x faster than
    numpy's argsort on tens of millions of hashes."""
    import polars as pl

    if not len(pages):
        return np.zeros(0, np.int64), 0
    ids = pl.Series(pages, dtype=pl.UInt64).rank("dense").to_numpy().astype(np.int64) - 1
    return ids, int(ids.max()) + 1


def _runs(values: np.ndarray, sort: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values and their counts (``np.unique(return_counts=True)`` with less overhead);
    ``sort=False``: the runs of equal neighbours in the given order."""
    v = np.sort(values) if sort else values
    n = len(v)
    if n == 0:
        return v, np.zeros(0, np.int64)
    first = np.empty(n, bool)  # np.r_ costs ~20 us a call, most of this function on short runs
    first[0] = True
    np.not_equal(v[1:], v[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    counts = np.empty(len(starts), np.int64)
    np.subtract(starts[1:], starts[:-1], out=counts[:-1])
    counts[-1] = n - starts[-1]
    return v[starts], counts


class _Fenwick:
    """Binary indexed tree over positions 0..n-1 in plain Python ints: callers pass the few
    distinct positions of an event (runs), where scalar loops beat numpy calls."""

    def __init__(self, n: int):
        self.n = n
        self.t = [0] * (n + 1)

    def add(self, idx: np.ndarray, delta: np.ndarray) -> None:
        t, n = self.t, self.n
        for i, d in zip(idx.tolist(), delta.tolist()):
            i += 1
            while i <= n:
                t[i] += d
                i += i & -i

    def prefix(self, idx: np.ndarray) -> np.ndarray:
        """Σ of positions 0..idx (inclusive), per element of ``idx``."""
        t = self.t
        out = []
        for i in idx.tolist():
            i += 1
            s = 0
            while i > 0:
                s += t[i]
                i -= i & -i
            out.append(s)
        return np.array(out, np.int64)
