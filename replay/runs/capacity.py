"""``capacity_sweep``: SWA-aware capacity curves, by replaying a trace at each size of one pool.

The one-pass curve (:func:`replay.analysis.capacity.capacity_curve`) answers "what prefix-hit
ratio does a full pool of C tokens give" for every C at once, from LRU stack distances. No such
pass exists for the SWA pool (whether an SWA page survives depends on tombstoning, window locks
and admission, which change with the pool size) nor for the HiCache host pool (what reaches it
depends on the device pool's evictions and the write policy). So each size is one replay:

- ``pool="swa"`` varies ``swa_pool_tokens``, ``pool="host"`` ``host_pool_tokens`` and
  ``pool="full"`` ``full_pool_tokens``; the other two pools stay at the source's resolved sizes
  under ``policy`` (a recorded trace: its server's; a workload: the knob defaults) or at the
  sizes given. Every point sets all three knobs, so the runs are ``policy=P/full_pool_tokens=F/
  swa_pool_tokens=S/host_pool_tokens=H`` of one sweep directory (:func:`replay.runs.sweep.sweep`
  with explicit points: parallel, local processes or Ray, resumable, and a re-run may add sizes).
- Per size: prefix-hit ratio, host hit ratio, TTFT p50/p99, retractions, aborts, peak/mean SWA
  and full used, the pool's size in GB (bytes per token from the trace or ``model``:
  :func:`replay.runs.kv_gb.resolve_bytes`; a host pool of H tokens is H host_full plus H host_swa
  rows, as the generic host SWA pool is sized from ``host_pool_tokens``), and the one-pass LRU
  hit ratio of the full pool (at each size for ``pool="full"``, at the fixed full pool otherwise):
  the fast bound. It bounds the device prefix hits (measured: every replay below it); with a host
  pool, ``prefix_hit_ratio`` counts host hits too and can exceed it.
- The result (config, rows, bytes, notes) is written to ``OUT/capacity.json`` (next to the
  sweep's ``sweep.json`` and ``summary.parquet``); :func:`load_capacity` reads it back.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from replay.backends.base import FIGURES as FIGURES_ONLY
from replay.runs.summary import SUMMARY_FILE, RunError, figures_only, read_summary, refuse_untraced

GB = 1e9
POOLS = ("full", "swa", "host")
#: the knob each pool's size is
KNOB = {"full": "full_pool_tokens", "swa": "swa_pool_tokens", "host": "host_pool_tokens"}
CAPACITY_FILE = "capacity.json"
#: default sizes: ``points`` log-spaced from ``max / DEFAULT_SPAN`` to ``max``
DEFAULT_POINTS, DEFAULT_SPAN = 6, 16
#: the figures of a run kept per size
FIGURES = ("requests", "finished", "aborted", "retractions", "prefix_hit_ratio", "host_hit_ratio", "ttft_p50_ms",
           "ttft_p99_ms", "queue_p99_ms", "peak_swa_used", "mean_swa_used", "peak_full_used", "swa_evicted_tokens",
           "peak_swa_used_gb", "mean_swa_used_gb", "peak_full_used_gb", "host_pool_gb", "sim_s", "wall_s")


@dataclasses.dataclass(frozen=True)
class CapacityConfig:
    """What a capacity sweep was asked (saved with its result)."""

    source: str
    pool: str
    sizes_tokens: tuple
    full_pool_tokens: int
    swa_pool_tokens: int
    host_pool_tokens: int
    page_size: int
    policy: str = "recorded"
    backend: str = "reference"
    model: str | None = None
    jobs: int = 2
    executor: str = "local"
    #: each size's trace kept; False: the sizes ran figures-only (``detail="figures"``,
    #: :mod:`replay.backends.figures`: the same summary, no trace). True for sweeps made before
    #: figures-only runs (they kept their traces)
    traces: bool = True

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"sizes_tokens": list(self.sizes_tokens)}


@dataclasses.dataclass(frozen=True)
class CapacitySweep:
    """One row per size (ascending): ``size_tokens``, ``size_gb``, the three pool sizes, ``status``
    (``ok``/``failed``), the run's :data:`FIGURES`, ``one_pass_hit_ratio`` and ``run`` (relative to
    ``out``); the bytes per token used and where they came from; notes."""

    config: CapacityConfig
    bytes_per_token: dict
    kv_bytes_source: str
    rows: tuple
    out: str = ""
    notes: tuple = ()

    def to_dict(self) -> dict:
        return {"kind": "capacity_sweep", "config": self.config.to_dict(), "bytes_per_token": dict(self.bytes_per_token),
                "kv_bytes_source": self.kv_bytes_source, "rows": [dict(r) for r in self.rows], "out": self.out,
                "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: dict) -> CapacitySweep:
        c = dict(d["config"])
        c["sizes_tokens"] = tuple(c["sizes_tokens"])
        return cls(CapacityConfig(**c), dict(d["bytes_per_token"]), d.get("kv_bytes_source", ""),
                   tuple(d["rows"]), d.get("out", ""), tuple(d.get("notes") or ()))

    def frame(self):
        """Polars DataFrame, one row per size (the columns of :data:`COLUMNS`)."""
        import polars as pl

        return pl.DataFrame([{c: r.get(c) for c in COLUMNS} for r in self.rows], infer_schema_length=None)

    def row(self, size_tokens: int) -> dict:
        """The row of one size (KeyError naming the sizes swept)."""
        for r in self.rows:
            if r["size_tokens"] == size_tokens:
                return r
        raise KeyError(f"size {size_tokens} not swept; sizes: {[r['size_tokens'] for r in self.rows]}")


COLUMNS = ("size_tokens", "size_gb", "full_pool_tokens", "swa_pool_tokens", "host_pool_tokens", "status", *FIGURES,
           "one_pass_hit_ratio")


def capacity_sweep(source: str | Path, out: str | Path, *, pool: str = "swa", sizes_tokens=None,
                   points: int | None = None, min_tokens: int | None = None, max_tokens: int | None = None,
                   full_pool_tokens: int | None = None, swa_pool_tokens: int | None = None,
                   host_pool_tokens: int | None = None, policy: str = "recorded", backend: str = "reference",
                   model: str | None = None, jobs: int = 2, executor: str = "local", traces: bool = False,
                   progress: bool = False) -> CapacitySweep:
    """Replay ``source`` at each size of ``pool`` into the sweep directory ``out`` (module docstring).

    Args:
        pool: ``swa``, ``host`` or ``full``.
        sizes_tokens: the sizes (tokens, whole pages); default ``points`` sizes (default
            :data:`DEFAULT_POINTS`) log-spaced from ``min_tokens`` (default ``max / 16``; for SWA at
            least the window plus a page, two pages at least) to ``max_tokens`` (default the pool's
            resolved size; the host pool without one: four full pools), each to the nearest page.
        full_pool_tokens, swa_pool_tokens, host_pool_tokens: the fixed size of the pools not swept
            (default: resolved from ``source`` under ``policy``).
        model: a model preset for the bytes per token (needed when the trace records none).
        jobs, executor, progress: as :func:`replay.runs.sweep.sweep`.
        traces: keep each size's trace (``kvtrace report``'s evidence, ``diff``, ``doctor``). Off
            (the default; reference backend): the sizes run figures-only, their summaries computed
            as they replay (:mod:`replay.backends.figures`, the same figures) and no trace written;
            a sweep resumed with ``traces`` refuses sizes an earlier run kept no trace of.
    Raises:
        RunError: an unknown pool, a bad size (not a positive whole number of pages, too small for
            the pool; a size given twice runs once), no bytes per token (give ``model``), a source without
            SWA for ``pool="swa"``, ``out`` holding another capacity sweep or sweep.
    """
    from replay.runs.sweep import sweep

    source, out = Path(source), Path(out)
    if pool not in POOLS:
        raise RunError(f"--pool {pool!r}: unknown pool; known: {', '.join(POOLS)}")
    fixed, page, window = _fixed_sizes(source, policy, backend, full_pool_tokens, swa_pool_tokens, host_pool_tokens)
    if pool == "swa" and not window:
        raise RunError(f"{source}: no SWA pool under policy {policy!r} (sliding_window_tokens is 0); "
                       "an SWA curve needs a hybrid-SWA source (a sliding window under --policy)")
    floor = _floor(pool, page, window)
    sizes = (_check_sizes(sizes_tokens, pool, page, floor) if sizes_tokens is not None else
             _default_sizes(pool, fixed, page, floor, points, min_tokens, max_tokens))
    bpt, kv_source = _bytes(source, model, pool)
    traces = bool(traces) or backend != "reference"
    cfg = CapacityConfig(str(source), pool, tuple(sizes), fixed["full_pool_tokens"], fixed["swa_pool_tokens"],
                         fixed["host_pool_tokens"], page, policy, backend, model, jobs, executor, traces)
    _claim(out, cfg)
    pts = [fixed | {KNOB[pool]: s} for s in sizes]
    pts = [{k: pt[k] for k in ("full_pool_tokens", "swa_pool_tokens", "host_pool_tokens")} for pt in pts]
    if traces:
        from replay.runs.jobs import RunSpec

        refuse_untraced(out, [f"{pt[KNOB[pool]]:,}" for pt in pts
                              if figures_only(out / RunSpec(policy, tuple(pt.items())).rel_dir)],
                        "sizes", "capacity sweep", "size")
    df = sweep(source, out, policies=[policy], points=pts, jobs=jobs, executor=executor, backend=backend,
               detail="counts" if traces else FIGURES_ONLY, progress=progress, model=model)
    errors = {r["run"]: r["error"] for r in df.select("run", "error").to_dicts() if r["error"]}
    bound, notes = _one_pass(source, pool, sizes, fixed["full_pool_tokens"])
    rows = tuple(_row(out, policy, pool, pt, bpt, errors, b) for pt, b in zip(pts, bound))
    failed = [r["size_tokens"] for r in rows if r["status"] != "ok"]
    if failed:
        notes.append(f"{len(failed)} size(s) failed: {failed} (see each row's error); re-run to retry them")
    if any(r.get("aborted") for r in rows if r["status"] == "ok"):
        notes.append("some sizes aborted requests (a request that cannot fit the pools): their figures "
                     "cover the finished requests only")
    res = CapacitySweep(cfg, bpt, kv_source, rows, str(out), tuple(notes))
    tmp = out / f".{CAPACITY_FILE}.tmp"
    tmp.write_text(json.dumps(res.to_dict(), indent=1, default=str))
    tmp.replace(out / CAPACITY_FILE)
    return res


def load_capacity(path: str | Path) -> CapacitySweep:
    """A capacity sweep's result (``path``: ``capacity.json`` or its directory)."""
    p = Path(path)
    p = p / CAPACITY_FILE if p.is_dir() else p
    try:
        d = json.loads(p.read_text())
        if d.get("kind") != "capacity_sweep":
            raise ValueError("no kind 'capacity_sweep'")
        return CapacitySweep.from_dict(d)
    except FileNotFoundError:
        raise RunError(f"{p}: missing; expected the {CAPACITY_FILE} of kvtrace capacity --out") from None
    except (ValueError, KeyError, TypeError) as e:
        raise RunError(f"{p}: not a kvtrace capacity sweep ({e})") from None


def _fixed_sizes(source: Path, policy: str, backend: str, full, swa, host) -> tuple[dict, int, int]:
    """({knob: size} of the three pools, page size, window): given, else resolved from ``source``."""
    from replay.runs.replay import resolve_settings

    values, _ = resolve_settings(source, policy, (), backend)
    page = int(values.get("page_size") or 1)
    window = int(values.get("sliding_window_tokens") or 0)
    f = int(full) if full is not None else int(values["full_pool_tokens"])
    raw_swa = int(values.get("swa_pool_tokens") or 0) or int(f * float(values.get("swa_full_tokens_ratio") or 0))
    s = int(swa) if swa is not None else raw_swa // page * page
    h = int(host) if host is not None else int(values.get("host_pool_tokens") or 0)
    for name, v, lo in (("--full-pool-tokens", f, page), ("--swa-pool-tokens", s, 0), ("--host-pool-tokens", h, 0)):
        if v < lo or v % page:
            raise RunError(f"{name} {v}: expected a whole number of pages of {page} tokens"
                           + (" (at least one)" if lo else ""))
    return {"full_pool_tokens": f, "swa_pool_tokens": s, "host_pool_tokens": h}, page, window


def _floor(pool: str, page: int, window: int) -> int:
    """The smallest size a replay takes (the settings' checks: SWA above the window, two pages)."""
    if pool == "swa":
        return max(2 * page, (window // page + 1) * page)
    return page


def _check_sizes(sizes, pool: str, page: int, floor: int) -> list[int]:
    out = []
    for s in sizes if not isinstance(sizes, (int, float, str)) else [sizes]:
        try:
            v = float(s)
        except (TypeError, ValueError):
            raise RunError(f"size {s!r}: expected a number of tokens, e.g. 8192") from None
        if not math.isfinite(v) or v <= 0 or v != int(v):
            raise RunError(f"size {s!r}: expected a positive whole number of tokens")
        v = int(v)
        if v % page:
            raise RunError(f"size {v}: not a whole number of pages of {page} tokens "
                           f"(use {v // page * page or page} or {(v // page + 1) * page})")
        if v < floor:
            raise RunError(f"size {v}: below the smallest {pool} pool a replay takes, {floor} tokens"
                           + (" (the sliding window plus a page, at least two pages)" if pool == "swa" else ""))
        out.append(v)
    if not out:
        raise RunError("no sizes given; e.g. --sizes 8192,16384,32768 or --points 6")
    from replay.knobs import MAX_POOL_TOKENS

    if max(out) > MAX_POOL_TOKENS:
        raise RunError(f"size {max(out)}: above the largest pool a replay takes ({MAX_POOL_TOKENS} tokens)")
    return sorted(set(out))


def _default_sizes(pool: str, fixed: dict, page: int, floor: int, points, lo, hi) -> list[int]:
    import numpy as np

    n = DEFAULT_POINTS if points is None else points
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 64:
        raise RunError(f"--points {points!r}: expected a whole number from 1 to 64")
    if hi is None:
        hi = fixed[KNOB[pool]] or (4 * fixed["full_pool_tokens"] if pool == "host" else 0)
    for name, v in (("--max-tokens", hi), ("--min-tokens", lo)):
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise RunError(f"{name} {v!r}: expected a positive number of tokens")
    hi = int(hi) // page * page
    lo = max(floor, int(lo) // page * page if lo is not None else hi // DEFAULT_SPAN // page * page)
    if hi < lo:
        raise RunError(f"--max-tokens {hi}: below the smallest size {lo} ({pool} pool)")
    if n == 1 or hi == lo:
        return [hi]
    raw = np.geomspace(lo, hi, n)
    return _check_sizes([max(floor, int(round(v / page)) * page) for v in raw], pool, page, floor)


def _bytes(source: Path, model: str | None, pool: str) -> tuple[dict, str]:
    from replay.models import ModelError
    from replay.runs.kv_gb import resolve_bytes

    try:
        kvb = resolve_bytes(source, model)
    except ModelError as e:
        raise RunError(str(e)) from None
    bpt = {k: v for k, v in (kvb.get("bytes_per_token") or {}).items() if v}
    need = {"full": ("full",), "swa": ("swa",), "host": ("host_full",)}[pool]
    if pool == "host" and "host_full" not in bpt and "full" in bpt:
        bpt["host_full"] = bpt["full"]  # a host pool stores its device pool's bytes per token
    missing = [k for k in need if k not in bpt]
    if missing:
        if kvb["source"] == "none":
            raise RunError(f"{source}: no bytes per token (the trace records none), so no GB figures; give "
                           "--model NAME (kvtrace capacity --help lists the presets)")
        raise RunError(f"{source}: no bytes per token of the {', '.join(missing)} pool in "
                       f"{'--model ' + str(model) if model else 'the trace'}; give another --model")
    return bpt, str(kvb["source"]) + (f" {kvb['model']}" if kvb.get("model") else "")


def _claim(out: Path, cfg: CapacityConfig) -> None:
    """Refuse an ``out`` whose capacity sweep asked something else (other sizes may be added)."""
    path = out / CAPACITY_FILE
    if not path.is_file():
        return
    old = load_capacity(path).config
    keys = ("source", "pool", "full_pool_tokens", "swa_pool_tokens", "host_pool_tokens", "policy", "backend", "model")
    diff = [k for k in keys if getattr(old, k) != getattr(cfg, k) and k != KNOB[cfg.pool]]
    if diff:
        k = diff[0]
        raise RunError(f"{out}: holds a capacity sweep with {k}={getattr(old, k)}, now {getattr(cfg, k)}; "
                       "choose a new --out (re-running the same sweep resumes it)")


def _one_pass(source: Path, pool: str, sizes, full: int) -> tuple[list, list[str]]:
    """The full pool's one-pass LRU hit ratio per row (at the size, or at the fixed full pool)."""
    from replay.analysis.capacity import capacity_curve

    try:
        c = capacity_curve(source)
    except Exception as e:  # noqa: BLE001 - a source the one-pass curve cannot read: no bound
        return [None] * len(sizes), [f"no one-pass bound ({type(e).__name__}: {e})"]
    if pool == "full":
        return [round(float(c.at(s)), 6) for s in sizes], []
    return [round(float(c.at(full)), 6)] * len(sizes), []


def _row(out: Path, policy: str, pool: str, pt: dict, bpt: dict, errors: dict, bound) -> dict:
    from replay.runs.jobs import RunSpec

    rel = RunSpec(policy, tuple(pt.items())).rel_dir
    size = pt[KNOB[pool]]
    per = {"full": bpt.get("full"), "swa": bpt.get("swa"),
           "host": (bpt.get("host_full") or 0) + (bpt.get("host_swa") or 0)}[pool]
    row = {"size_tokens": size, "size_gb": round(size * per / GB, 6) if per else None} | dict(pt)
    row |= {"one_pass_hit_ratio": bound, "run": str(rel).replace("\\", "/")}
    if not (out / rel / SUMMARY_FILE).is_file():
        return row | {"status": "failed", "error": errors.get(row["run"], "no summary")}
    s = read_summary(out / rel).to_dict()
    return row | {"status": "ok", "error": ""} | {k: s.get(k) for k in FIGURES}


__all__ = ["CAPACITY_FILE", "COLUMNS", "FIGURES", "KNOB", "POOLS", "CapacityConfig", "CapacitySweep",
           "capacity_sweep", "load_capacity"]
