"""Shared helpers of the query library: trace arguments, durations, pool lists, DuckDB views."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

from replay.trace import Trace, open_trace

POOLS_ALL = ("full", "swa", "host_full", "host_swa", "req_to_token")
# Pools that hold KV tokens (req_to_token counts request rows, not tokens).
POOLS_KV = ("full", "swa", "host_full", "host_swa")
_UNITS_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
             "min": 60_000_000_000, "h": 3_600_000_000_000}
_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|min|m|h)\s*$")
_view_ids = itertools.count()


def as_trace(trace) -> Trace:
    """A :class:`replay.trace.Trace` from a Trace or a trace directory path."""
    if isinstance(trace, Trace):
        return trace
    if isinstance(trace, (str, os.PathLike)):
        return open_trace(Path(trace))
    raise TypeError(f"expected a trace directory or replay.trace.Trace, got {type(trace).__name__}")


def duration_ns(value, name: str = "resample") -> int:
    """``"1s"``, ``"250ms"``, ``"10us"``, ``"2m"`` or an int of ns -> ns (> 0)."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: expected a duration like '1s', '100ms' or ns as an int")
    if isinstance(value, int):
        ns = value
    elif isinstance(value, float):
        ns = int(value * 1e9)
    else:
        m = _DUR_RE.match(str(value))
        if not m:
            raise ValueError(f"{name}={value!r}: expected a duration like '1s', '100ms', '10us' "
                             f"or ns as an int")
        ns = int(float(m.group(1)) * _UNITS_NS[m.group(2)])
    if ns <= 0:
        raise ValueError(f"{name}={value!r}: must be > 0")
    return ns


def pool_list(pools, default=POOLS_KV) -> tuple[str, ...]:
    """Validated tuple of pool names (None -> ``default``; a single name is allowed)."""
    if pools is None:
        return tuple(default)
    if isinstance(pools, str):
        pools = (pools,)
    bad = [p for p in pools if p not in POOLS_ALL]
    if bad:
        raise ValueError(f"unknown pool(s) {bad}; expected some of {', '.join(POOLS_ALL)}")
    return tuple(pools)


def check_engine(engine: str) -> str:
    if engine not in ("polars", "duckdb"):
        raise ValueError(f"engine={engine!r}: expected 'polars' or 'duckdb'")
    return engine


def view(trace: Trace, family: str) -> str:
    """Register ``family`` as a uniquely named view on the trace's DuckDB connection."""
    name = f"kv_{family}_{next(_view_ids)}"
    trace.relation(family).to_view(name, replace=True)
    return name


def sql_list(values) -> str:
    return "(" + ", ".join("'" + str(v).replace("'", "''") + "'" for v in values) + ")"


def page_size_of(trace: Trace, page_size: int | None = None) -> int:
    """Page size: the argument, else the manifest's server page size, else its hash block."""
    if page_size:
        return int(page_size)
    server = trace.manifest.get("server") or {}
    return int(server.get("page_size") or trace.manifest.get("hash_block_tokens") or 1)
