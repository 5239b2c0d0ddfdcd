"""Tree match / insert / evict of a 1k-token request (page_size 64 by default).

The device pools hold ``--num-cached`` requests of ``--request-tokens`` tokens; the tree is
warmed with requests that share prefixes (a few conversation roots) until the pools are full,
evicting LRU leaves as needed (steady state under memory pressure, so the free lists stay
short). Each measured iteration takes a new request of the same size that shares a prefix with
cached ones and times, separately:

* ``match``  — ``RadixTree.match`` of its page hashes;
* ``insert`` — ``RadixTree.insert`` of its pages (frees the duplicated prefix pages);
* ``evict``  — ``RadixTree.evict(full_tokens=request_tokens)`` (one LRU victim ≈ 1k tokens).

Pages for the request are allocated outside the timed region. Reported in µs (median, p90).

``--real`` (default: on when sglang imports) also drives the real sglang 0.5.23
``UnifiedRadixCache`` (default Rust tree core, FULL+SWA components, the same page size, sliding
window and pool sizes, real ``SWATokenToKVPoolAllocator``/``SWAKVPool``, built by the SGLang
backend's ``build_runtime``) through the **same** key sequence: token ids are synthesized from
each page hash with the backend's ``tokens.block_token_ids``, so two keys share exactly the pages
their hash lists share. It is driven as the scheduler's cache layer calls it:
``match_prefix(MatchPrefixParams(key=RadixKey))``, ``insert(InsertParams(key, value))``
(``prev_prefix_len=0``: the tree frees the duplicated prefix pages, as ours does) and
``evict(EvictParams(num_tokens=request_tokens))``; pages come from the real allocator's
``alloc_extend`` outside the timed region, evicting a request's worth when it is full (as ours).
Params objects are built outside the timed region. The ratio ours/real compares our FULL+SWA
tree (``full_swa``) with it, per op, on the median and on the p90. Without sglang the real side
is skipped with the reason on stderr; with an explicit ``--real`` that is an error (exit 1).

Usage: python bench/tree_ops.py [--json] [--iters N] [--page-size 64] [--window 128]
                                [--real | --no-real]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from replay.memory.allocator import DeviceAllocator  # noqa: E402
from replay.memory.radix import RadixTree  # noqa: E402
from replay.memory.swa_allocator import PlainKVPools, SWAKVPools  # noqa: E402


def build(args, window: int):
    ps = args.page_size
    pages = args.request_tokens // ps
    full = DeviceAllocator(args.num_cached * pages * ps, ps, args.device_free, "full")
    if window:
        swa = DeviceAllocator(args.num_cached * pages * ps, ps, args.device_free, "swa")
        pools = SWAKVPools(full, swa)
    else:
        pools = PlainKVPools(full)
    tree = RadixTree(pools, ps, window_tokens=window, eviction="lru",
                     swa_lru_refresh="window_aware")
    return tree, pools


def make_key(rng: random.Random, roots: list[list[int]], pages: int, uid: int) -> list[int]:
    root = rng.choice(roots)
    shared = rng.randint(1, pages // 2)
    return root[:shared] + [(uid << 20) + i for i in range(pages - shared)]


def run(args, window: int) -> dict[str, list[float]]:
    rng = random.Random(args.seed)
    tree, pools = build(args, window)
    ps = args.page_size
    pages = args.request_tokens // ps
    roots = [[(r << 40) + i for i in range(pages)] for r in range(1, 9)]
    uid = 1

    def alloc_row():
        row = pools.alloc_extend_pages([0], [pages * ps])
        while row is None:
            tree.evict(full_tokens=pages * ps)
            row = pools.alloc_extend_pages([0], [pages * ps])
        return row[0]

    for _ in range(2 * args.num_cached):
        key = make_key(rng, roots, pages, uid)
        uid += 1
        tree.insert(key, alloc_row())
    times = {"match": [], "insert": [], "evict": []}
    clock = time.perf_counter_ns
    for _ in range(args.iters + args.warmup):
        key = make_key(rng, roots, pages, uid)
        uid += 1
        row = alloc_row()
        t0 = clock()
        tree.match(key)
        t1 = clock()
        tree.insert(key, row)
        t2 = clock()
        tree.evict(full_tokens=pages * ps)
        t3 = clock()
        times["match"].append((t1 - t0) / 1e3)
        times["insert"].append((t2 - t1) / 1e3)
        times["evict"].append((t3 - t2) / 1e3)
    tree.check_integrity()
    return {k: v[args.warmup:] for k, v in times.items()}


def key_sequence(args):
    """The keys ``run`` draws, in order (warm-up inserts, then one per measured iteration).

    Same seed, roots and uid progression as ``run`` (``make_key`` is the only consumer of the
    rng there), so both trees see the identical sequence.
    """
    rng = random.Random(args.seed)
    pages = args.request_tokens // args.page_size
    roots = [[(r << 40) + i for i in range(pages)] for r in range(1, 9)]
    for uid in range(1, 2 * args.num_cached + args.iters + args.warmup + 1):
        yield make_key(rng, roots, pages, uid)


class RealUnavailable(RuntimeError):
    """The real sglang tree cannot be built here (reason in the message)."""


def build_real(args, window: int):
    """The real ``UnifiedRadixCache`` (FULL+SWA, Rust core) and its allocator, sized as ours.

    Returns:
        (runtime, env context manager still open) — close the context with ``.__exit__``.
    Raises:
        RealUnavailable: sglang missing/unsupported, or the Rust tree core is unavailable.
    """
    try:
        from replay.backends.sglang.build import build_runtime, sglang_env
        from replay.backends.sglang.settings import SglangSettings
        from replay.backends.sglang.env import bootstrap

        bootstrap()
    except Exception as exc:  # noqa: BLE001 - any import/bootstrap failure is the reason
        raise RealUnavailable(f"sglang bootstrap failed: {type(exc).__name__}: {exc}") from exc
    ps = args.page_size
    pool = args.num_cached * (args.request_tokens // ps) * ps
    # sglang frees prepend (need_sort=False) or stage-and-sort (need_sort=True); our ``append``
    # has no sglang counterpart and runs the real tree with prepend.
    settings = SglangSettings(
        page_size=ps, sliding_window_tokens=window, full_pool_tokens=pool, swa_pool_tokens=pool,
        eviction_policy="lru", tree_core="rust", device_free="sorted_merge" if args.device_free == "sorted_merge" else "prepend",
        max_running_requests=1,
    )
    env = sglang_env(settings, debug_memory_pool=False)
    env.__enter__()
    try:
        rt = build_runtime(settings, max_context_tokens=args.request_tokens)
    except Exception as exc:  # noqa: BLE001
        env.__exit__(None, None, None)
        raise RealUnavailable(f"building the real UnifiedRadixCache failed: "
                              f"{type(exc).__name__}: {exc}") from exc
    return rt, env


def run_real(args, window: int) -> tuple[dict[str, list[float]], dict, list[int]]:
    """Time the real tree on the key sequence of ``run``.

    Returns:
        (times per op in µs, info for the JSON, device hit tokens of every measured match).
    """
    import numpy as np
    from array import array

    from replay.backends.sglang.tokens import block_token_ids

    rt, env = build_real(args, window)
    try:
        from sglang.srt.mem_cache.base_prefix_cache import (
            EvictParams,
            InsertParams,
            MatchPrefixParams,
        )
        from sglang.srt.mem_cache.radix_cache import RadixKey

        tree, allocator = rt.tree, rt.allocator
        ps = args.page_size
        n_tok = (args.request_tokens // ps) * ps
        zero = torch.zeros(1, dtype=torch.int64)
        seq = torch.tensor([n_tok], dtype=torch.int64)
        last_loc = torch.full((1,), -1, dtype=torch.int64)
        evict_params = EvictParams(num_tokens=n_tok)

        def radix_key(key: list[int]):
            ids = array("q")
            ids.frombytes(block_token_ids(np.asarray(key, dtype=np.uint64), ps)
                          .astype(np.int64).tobytes())
            return RadixKey(ids)

        def alloc_row():
            row = allocator.alloc_extend(zero, zero, seq, seq, last_loc, n_tok)
            while row is None:
                if tree.evict(EvictParams(num_tokens=n_tok)).num_tokens_evicted == 0:
                    raise RuntimeError("real tree: pool full and nothing evictable")
                row = allocator.alloc_extend(zero, zero, seq, seq, last_loc, n_tok)
            return row

        keys = key_sequence(args)
        for _ in range(2 * args.num_cached):
            tree.insert(InsertParams(key=radix_key(next(keys)), value=alloc_row()))
        times = {"match": [], "insert": [], "evict": []}
        hits = []
        clock = time.perf_counter_ns
        for key in keys:
            rk = radix_key(key)
            row = alloc_row()
            match_params = MatchPrefixParams(key=rk)
            insert_params = InsertParams(key=rk, value=row)
            t0 = clock()
            m = tree.match_prefix(match_params)
            t1 = clock()
            tree.insert(insert_params)
            t2 = clock()
            tree.evict(evict_params)
            t3 = clock()
            times["match"].append((t1 - t0) / 1e3)
            times["insert"].append((t2 - t1) / 1e3)
            times["evict"].append((t3 - t2) / 1e3)
            hits.append(m.device_prefix_len)
        hits = hits[args.warmup:]
        info = {
            "tree_core": tree._tree_core_backend,
            "components": [c.name for c in tree.tree_components],
            "full_pool_tokens": rt.settings.full_pool_tokens,
            "swa_pool_tokens": rt.settings.swa_tokens,
            "sliding_window": window,
            "mean_hit_tokens": round(sum(hits) / max(len(hits), 1), 1),
            "full_evictable_tokens": tree.full_evictable_size(),
        }
    finally:
        rt.close()
        env.__exit__(None, None, None)
    return {k: v[args.warmup:] for k, v in times.items()}, info, hits


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    out = {}
    for op, xs in times.items():
        xs = sorted(xs)
        out[op] = {
            "median_us": round(statistics.median(xs), 2),
            "p90_us": round(xs[int(0.9 * (len(xs) - 1))], 2),
        }
    return out


OPS = ("match", "insert", "evict")


def real_summary(ours: dict, real: dict, info: dict) -> dict:
    """Result keys of the real side: its summary, flat medians/p90s and ours/real ratios."""
    out = {"real": info, "real_full_swa": real}
    for op in OPS:
        out[f"real_{op}_us"] = real[op]["median_us"]
        out[f"real_{op}_p90_us"] = real[op]["p90_us"]
        out[f"ratio_{op}"] = round(ours[op]["median_us"] / real[op]["median_us"], 3)
        out[f"ratio_{op}_p90"] = round(ours[op]["p90_us"] / real[op]["p90_us"], 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--request-tokens", type=int, default=1024)
    ap.add_argument("--window", type=int, default=128, help="SWA window for the SWA tree")
    ap.add_argument("--num-cached", type=int, default=2000)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device-free", default="prepend",
                    choices=["prepend", "append", "sorted_merge"])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--real", action=argparse.BooleanOptionalAction, default=None,
                    help="also time the real sglang UnifiedRadixCache (Rust core, FULL+SWA) on the "
                         "same keys; default: on when sglang imports. An explicit --real fails "
                         "(exit 1) when it cannot")
    args = ap.parse_args(argv)
    if args.real and not args.window:
        print("tree_ops: --real compares FULL+SWA trees and needs --window > 0", file=sys.stderr)
        return 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    real_error = None
    try:
        result = {
            "page_size": args.page_size,
            "request_tokens": args.request_tokens,
            "num_cached": args.num_cached,
            "device_free": args.device_free,
            "full_only": summarize(run(args, 0)),
            "full_swa": summarize(run(args, args.window)),
        }
        if args.real is not False and args.window:
            try:
                real_times, real_info, _ = run_real(args, args.window)
            except RealUnavailable as exc:
                real_error = str(exc)
            else:
                result.update(real_summary(result["full_swa"], summarize(real_times), real_info))
    finally:
        torch.set_num_threads(threads)
    if real_error is not None:
        print(f"tree_ops: real sglang tree not measured: {real_error}", file=sys.stderr)
        if args.real:
            return 1
        result["real_skipped"] = real_error
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"tree ops, {args.request_tokens}-token request, page_size {args.page_size}, "
          f"pools of {args.num_cached} requests, device_free={args.device_free} (µs)")
    print(f"{'tree':<12}{'op':<8}{'median':>10}{'p90':>10}")
    for tree in ("full_only", "full_swa"):
        for op, s in result[tree].items():
            print(f"{tree:<12}{op:<8}{s['median_us']:>10.1f}{s['p90_us']:>10.1f}")
    if "real" in result:
        info = result["real"]
        print(f"\nours (full_swa) vs real sglang UnifiedRadixCache ({info['tree_core']} core, "
              f"{'+'.join(info['components'])}, W = {info['sliding_window']}), µs")
        print(f"{'op':<8}{'ours med':>10}{'real med':>10}{'ratio':>8}"
              f"{'ours p90':>10}{'real p90':>10}{'ratio':>8}")
        for op in OPS:
            ours, real = result["full_swa"][op], result["real_full_swa"][op]
            print(f"{op:<8}{ours['median_us']:>10.1f}{real['median_us']:>10.1f}"
                  f"{result[f'ratio_{op}']:>8.2f}{ours['p90_us']:>10.1f}{real['p90_us']:>10.1f}"
                  f"{result[f'ratio_{op}_p90']:>8.2f}")
        print("(ratio = ours / real; < 1 means our model is faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
