"""Tree match / insert / evict of a 1k-token request (page_size 64 by default).

The device pools hold ``--num-cached`` requests of ``--request-tokens`` tokens; the tree is
warmed with requests that share prefixes (a few conversation roots) until the pools are full,
evicting LRU leaves as needed (steady state under memory pressure, so the free lists stay
short). Each measured iteration takes a new request of the same size that shares a prefix with
cached ones and times, separately:

* ``match``  — ``RadixTree.match`` of its page hashes;
* ``insert`` — ``RadixTree.insert`` of its pages (frees the duplicated prefix pages);
* ``evict``  — ``RadixTree.evict(full_tokens=request_tokens)`` (one LRU victim ≈ 1k tokens).

Pages for the request are allocated outside the timed region. Reported in µs (median, p90),
absolute (the comparison against SGLang's Rust tree core comes with the SGLang backend).

Usage: python bench/tree_ops.py [--json] [--iters N] [--page-size 64] [--window 128]
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


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    out = {}
    for op, xs in times.items():
        xs = sorted(xs)
        out[op] = {
            "median_us": round(statistics.median(xs), 2),
            "p90_us": round(xs[int(0.9 * (len(xs) - 1))], 2),
        }
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
    args = ap.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = {
            "page_size": args.page_size,
            "request_tokens": args.request_tokens,
            "num_cached": args.num_cached,
            "device_free": args.device_free,
            "full_only": summarize(run(args, 0)),
            "full_swa": summarize(run(args, args.window)),
        }
    finally:
        torch.set_num_threads(threads)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"tree ops, {args.request_tokens}-token request, page_size {args.page_size}, "
          f"pools of {args.num_cached} requests, device_free={args.device_free} (µs)")
    print(f"{'tree':<12}{'op':<8}{'median':>10}{'p90':>10}")
    for tree in ("full_only", "full_swa"):
        for op, s in result[tree].items():
            print(f"{tree:<12}{op:<8}{s['median_us']:>10.1f}{s['p90_us']:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
