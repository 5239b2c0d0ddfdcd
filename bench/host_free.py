"""Per-call CPU time of host-pool free/alloc: ``eager_cat`` vs ``lazy_merge`` (sgl-project/sglang#30658).

For each pool size (slots) a ``HostPool`` is half filled with chunks, then a steady state is
measured: free the oldest held chunk, allocate a new one. Each call is timed with the thread
CPU clock (``time.thread_time_ns``) with torch on one intra-op thread, so the figure is the CPU
the scheduler thread burns. ``eager_cat`` concatenates onto the whole free list on every free
(O(pool)); ``lazy_merge`` appends the chunk and merges only when an allocation runs short, so
its per-call cost stays flat. The device allocator is measured the same way for ``prepend``
(paged allocator: a concatenation per free) and ``sorted_merge`` (staged frees, sort on merge).

Usage: python bench/host_free.py [--json] [--sizes 65536,262144,...] [--chunk-slots 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from replay.memory.allocator import DeviceAllocator  # noqa: E402
from replay.memory.host_pool import HostPool  # noqa: E402

DEFAULT_SIZES = [1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 23]  # 64k .. 8M slots


def _iters(size: int, eager: bool, base: int) -> int:
    """Fewer calls where each one walks megabytes (keeps the default run short)."""
    if not eager:
        return base
    return max(40, min(base, base * (1 << 18) // size))


def _summary(xs: list[int]) -> dict[str, float]:
    return {
        "median_ns": float(statistics.median(xs)),
        "mean_ns": float(statistics.fmean(xs)),
        "max_ns": float(max(xs)),
    }


def bench_host(mode: str, size: int, chunk: int, page: int, iters: int) -> dict:
    """Steady-state free+alloc cycles on a half-full host pool."""
    pool = HostPool(size, page, mode)
    held = [pool.alloc(chunk) for _ in range(size // 2 // chunk)]
    clock = time.thread_time_ns
    free_ns, alloc_ns = [], []
    merges0 = pool.num_merges
    for i in range(iters):
        victim = held[i % len(held)]
        t0 = clock()
        pool.free(victim)
        t1 = clock()
        held[i % len(held)] = pool.alloc(chunk)
        t2 = clock()
        free_ns.append(t1 - t0)
        alloc_ns.append(t2 - t1)
    pool.check_integrity()
    return {"free": _summary(free_ns), "alloc": _summary(alloc_ns),
            "merges": pool.num_merges - merges0}


def bench_device(mode: str, size: int, chunk: int, iters: int) -> dict:
    """The same cycle on a token-granular device allocator (page_size 1)."""
    alloc = DeviceAllocator(size, 1, mode)
    held = [alloc.alloc_pages(chunk) for _ in range(size // 2 // chunk)]
    clock = time.thread_time_ns
    free_ns, alloc_ns = [], []
    for i in range(iters):
        victim = held[i % len(held)]
        t0 = clock()
        alloc.free_page_ids(victim)
        t1 = clock()
        held[i % len(held)] = alloc.alloc_pages(chunk)
        t2 = clock()
        free_ns.append(t1 - t0)
        alloc_ns.append(t2 - t1)
    return {"free": _summary(free_ns), "alloc": _summary(alloc_ns), "merges": alloc.num_merges}


def run(args) -> dict:
    sizes = args.sizes
    host = {m: [bench_host(m, n, args.chunk_slots, args.page_size,
                           _iters(n, m == "eager_cat", args.iters)) for n in sizes]
            for m in ("eager_cat", "lazy_merge")}
    dev = {m: [bench_device(m, n, args.chunk_slots, _iters(n, m == "prepend", args.iters))
               for n in sizes]
           for m in ("prepend", "sorted_merge")}

    def med(rows, op):
        return [r[op]["median_ns"] for r in rows]

    eager, lazy = med(host["eager_cat"], "free"), med(host["lazy_merge"], "free")
    return {
        "pool_sizes": sizes,
        "eager_free_ns": eager,
        "lazy_free_ns": lazy,
        "eager_growth": eager[-1] / eager[0],
        "lazy_growth": lazy[-1] / lazy[0],
        "eager_alloc_ns": med(host["eager_cat"], "alloc"),
        "lazy_alloc_ns": med(host["lazy_merge"], "alloc"),
        "lazy_alloc_mean_ns": [r["alloc"]["mean_ns"] for r in host["lazy_merge"]],
        "lazy_merges": [r["merges"] for r in host["lazy_merge"]],
        "device_prepend_free_ns": med(dev["prepend"], "free"),
        "device_sorted_merge_free_ns": med(dev["sorted_merge"], "free"),
        "device_prepend_alloc_ns": med(dev["prepend"], "alloc"),
        "device_sorted_merge_alloc_ns": med(dev["sorted_merge"], "alloc"),
        "device_sorted_merge_alloc_mean_ns": [r["alloc"]["mean_ns"] for r in dev["sorted_merge"]],
        "chunk_slots": args.chunk_slots,
        "torch_threads": torch.get_num_threads(),
    }


def _fmt_us(ns: float) -> str:
    return f"{ns / 1e3:.1f}"


def print_table(r: dict) -> None:
    print(f"host pool, per-call CPU µs (median), chunk {r['chunk_slots']} slots, "
          f"torch threads {r['torch_threads']}")
    print(f"{'slots':>10} {'eager free':>11} {'lazy free':>10} {'eager alloc':>12} "
          f"{'lazy alloc':>11} {'lazy alloc mean':>16} {'merges':>7}")
    for i, n in enumerate(r["pool_sizes"]):
        print(f"{n:>10} {_fmt_us(r['eager_free_ns'][i]):>11} {_fmt_us(r['lazy_free_ns'][i]):>10} "
              f"{_fmt_us(r['eager_alloc_ns'][i]):>12} {_fmt_us(r['lazy_alloc_ns'][i]):>11} "
              f"{_fmt_us(r['lazy_alloc_mean_ns'][i]):>16} {r['lazy_merges'][i]:>7}")
    print(f"growth {r['pool_sizes'][0]} -> {r['pool_sizes'][-1]} slots: "
          f"eager free x{r['eager_growth']:.1f}, lazy free x{r['lazy_growth']:.1f}")
    print()
    print("device allocator (page_size 1), per-call CPU µs (median)")
    print(f"{'slots':>10} {'prepend free':>13} {'sorted free':>12} {'prepend alloc':>14} "
          f"{'sorted alloc':>13} {'sorted alloc mean':>18}")
    for i, n in enumerate(r["pool_sizes"]):
        print(f"{n:>10} {_fmt_us(r['device_prepend_free_ns'][i]):>13} "
              f"{_fmt_us(r['device_sorted_merge_free_ns'][i]):>12} "
              f"{_fmt_us(r['device_prepend_alloc_ns'][i]):>14} "
              f"{_fmt_us(r['device_sorted_merge_alloc_ns'][i]):>13} "
              f"{_fmt_us(r['device_sorted_merge_alloc_mean_ns'][i]):>18}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                    default=DEFAULT_SIZES, help="comma-separated pool sizes in slots")
    ap.add_argument("--chunk-slots", type=int, default=256, help="slots per free/alloc call")
    ap.add_argument("--page-size", type=int, default=64, help="host pool page size")
    ap.add_argument("--iters", type=int, default=2000, help="cycles per size (eager: fewer)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        result = run(args)
    finally:
        torch.set_num_threads(threads)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
