"""Generate a synthetic workload of a given shape: N request arrivals at a target rate.

Units (sessions, agent runs, ...) start according to an arrival process whose rate is
``qps / mean requests per unit``; each unit's requests arrive at the unit's start plus their
planned offsets. With ``warm_start`` (default) the process starts one long unit span (the 99th
percentile) before t = 0 and only arrivals at t >= 0 are kept, so the stream is stationary from
its first request, like a capture of a running server: some sessions are already under way.
The first ``num_requests`` arrivals are written. Every random draw comes from
``numpy.random.default_rng(seed)``, so the same options give byte-identical files.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from replay.workloads.arrivals import ArrivalProcess
from replay.workloads.errors import WorkloadError
from replay.workloads.hashing import chain_hashes, segment_block_keys
from replay.workloads.io import RequestColumns, write_workload
from replay.workloads.shapes import Shape, get_shape, make_config, unit_stats

DEFAULT_HASH_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class GenerateOptions:
    """Options common to every shape (the shape's own parameters are its config).

    Args:
        shape: registered shape name.
        num_requests: arrivals to write.
        qps: target request arrival rate (requests/s); None = the shape's default.
        seed: seed of every random draw.
        arrival: 'poisson' | 'gamma' for unit starts; None = the shape's default.
        arrival_cv: Gamma coefficient of variation; None = the shape's default.
        hash_block_tokens: tokens per page hash.
        warm_start: start the stream in steady state (see module docstring).
    """

    shape: str
    num_requests: int
    qps: float | None = None
    seed: int = 0
    arrival: str | None = None
    arrival_cv: float | None = None
    hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS
    warm_start: bool = True


@dataclass(frozen=True)
class _Arrival:
    at_s: float
    serial: int
    turn: int
    req: int  # index in the unit's requests


def generate(options: GenerateOptions, config=None, progress: bool = False) -> tuple[RequestColumns, dict]:
    """Generate the arrival rows of a workload.

    Args:
        options: shape, size, rate, seed, arrival process, hash block size.
        config: the shape's config (default: its defaults).
        progress: show tqdm progress bars (stderr).

    Returns:
        (rows in arrival order, manifest ``workload`` dict).
    """
    shape = get_shape(options.shape)
    cfg = config if config is not None else shape.config_cls()
    validate_options(options)
    validate_config(shape.name, cfg)
    qps = shape.default_qps if options.qps is None else float(options.qps)
    try:
        mean_req, span_p99 = unit_stats(shape, cfg)
    except ValueError as e:
        raise WorkloadError(f"shape {shape.name}: {e}") from None
    if not (math.isfinite(mean_req) and mean_req > 0 and math.isfinite(span_p99)):
        raise WorkloadError(f"shape {shape.name}: these parameters give {mean_req:.3g} requests per unit "
                            f"and a unit span of {span_p99:.3g} s; expected a positive, finite mean and span")
    process = ArrivalProcess(
        options.arrival or shape.default_arrival,
        qps / mean_req,
        shape.default_cv if options.arrival_cv is None else float(options.arrival_cv),
    )
    warmup_s = span_p99 if options.warm_start else 0.0
    span_s = warmup_s + options.num_requests / qps
    if not span_s <= MAX_SPAN_S:
        raise WorkloadError(f"shape {shape.name}: these parameters span about {span_s:.3g} s ({options.num_requests} "
                            f"requests at {qps:.3g} requests/s after a {warmup_s:.3g} s warm start); expected at "
                            f"most {MAX_SPAN_S:.3g} s (timestamps are int64 nanoseconds): raise --qps or pass "
                            "--cold-start")
    planned = (warmup_s + options.num_requests / qps) * process.rate_per_s  # units the plan walks
    if planned > MAX_PLANNED_UNITS:
        raise WorkloadError(f"shape {shape.name}: these parameters would plan about {planned:.3g} units "
                            f"(a {warmup_s:.3g} s warm start and {options.num_requests} requests at "
                            f"{process.rate_per_s:.3g} units/s); expected at most {MAX_PLANNED_UNITS:,}: "
                            "shorten the think/tool times, raise --qps or pass --cold-start")
    budget = plan_unit_budget(planned, options.num_requests)
    units, arrivals = _simulate(shape, cfg, process, options, warmup_s, progress, budget)
    cols = _materialize(units, arrivals, options.hash_block_tokens, progress)
    workload = {
        "shape": shape.name,
        "generator": "replay.workloads.generate",
        "parameters": asdict(cfg),
        "seed": options.seed,
        "num_requests": options.num_requests,
        "qps": qps,
        "arrival": {"kind": process.kind, "cv": process.cv if process.kind == "gamma" else 1.0},
        "warm_start": options.warm_start,
        "warmup_s": warmup_s,
        "mean_requests_per_unit": mean_req,
        "unit_rate_per_s": process.rate_per_s,
    }
    return cols, workload


def validate_options(options: GenerateOptions) -> None:
    """Refuse options that cannot describe a workload (before any work: a non-finite rate
    would never advance the arrival clock).

    Raises:
        WorkloadError: naming the option and what was expected.
    """
    if not isinstance(options.num_requests, int) or options.num_requests < 1:
        raise WorkloadError(f"--requests must be >= 1 (got {options.num_requests})")
    if options.num_requests > MAX_REQUESTS:
        raise WorkloadError(f"--requests {options.num_requests}: expected at most {MAX_REQUESTS:,}")
    if not isinstance(options.seed, int) or not 0 <= options.seed < 2**63:
        raise WorkloadError(f"--seed {options.seed}: expected an integer in 0..2**63-1")
    if options.qps is not None and not (math.isfinite(options.qps) and options.qps > 0):
        raise WorkloadError(f"--qps {options.qps}: expected a finite rate > 0 (requests per second)")
    if options.arrival_cv is not None and not (math.isfinite(options.arrival_cv)
                                               and MIN_ARRIVAL_CV <= options.arrival_cv <= MAX_ARRIVAL_CV):
        raise WorkloadError(f"--cv {options.arrival_cv}: expected a coefficient of variation in [{MIN_ARRIVAL_CV:g}, "
                            f"{MAX_ARRIVAL_CV:g}] (beyond it Gamma gaps underflow to zero and every "
                            "unit starts at the same instant)")
    if not isinstance(options.hash_block_tokens, int) or not 1 <= options.hash_block_tokens <= 1 << 20:
        raise WorkloadError(f"--hash-block-tokens {options.hash_block_tokens}: expected an integer in 1..{1 << 20}")


MAX_REQUESTS = 100_000_000
MAX_PLANNED_UNITS = 5_000_000  # beyond this a plan would run for hours: refused up front
MAX_SPAN_S = 1e8  # ~3 years of arrivals; int64 ns timestamps end at ~292 years
# Gamma shape k = 1/cv**2: at cv 100 (k 1e-4) a gap is still a number; at cv 1e6 (k 1e-12) almost
# every draw is 0.0 and the planner's clock would stand still.
MAX_ARRIVAL_CV = 100.0
MIN_ARRIVAL_CV = 1e-3  # below it 1/cv**2 overflows toward inf: use --arrival poisson or a small cv
MAX_TOKEN_PARAMETER = 1 << 24  # *_tokens* shape parameters (16,777,216 tokens per segment or cap)
MAX_STEPS_PARAMETER = 4096  # max_turns / max_steps / max_questions: requests per unit
MAX_WORKLOAD_BLOCKS = 50_000_000  # page hashes one workload may hold (400 MB of uint64)


def plan_unit_budget(planned_units: float, num_requests: int) -> int:
    """The most units ``_simulate`` may plan before it gives up: many times the expected count
    (``planned_units``) plus a margin per request, never above ``MAX_PLANNED_UNITS``.

    A bound that holds for every parameter value: the loop ends at this count whatever the
    arrival clock does (a gap that rounds to nothing leaves ``t`` where it was)."""
    return int(min(MAX_PLANNED_UNITS, 8 * planned_units + 16 * num_requests + 10_000))
MAX_COUNT_PARAMETER = 10_000  # num_* shape parameters (e.g. distinct system prompts)
_POSITIVE_PREFIXES = ("num_", "max_", "mean_", "chunked_")


def validate_config(shape_name: str, cfg) -> None:
    """Refuse shape parameters that are not finite, negative, zero where a count or a cap is
    needed, or inverted (``X_min > X_max``, ``min_X > max_X``).

    Raises:
        WorkloadError: ``<shape>.<parameter>=<value>: expected ...``.
    """
    from dataclasses import fields

    values = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not math.isfinite(v):
            raise WorkloadError(f"{shape_name}.{name}={v}: expected a finite number")
        if v < 0:
            raise WorkloadError(f"{shape_name}.{name}={v}: expected a value >= 0")
        if v == 0 and (name.startswith(_POSITIVE_PREFIXES) or name.endswith("_tokens_median")):
            raise WorkloadError(f"{shape_name}.{name}={v}: expected a value > 0")
        if name.startswith("num_") and v > MAX_COUNT_PARAMETER:
            raise WorkloadError(f"{shape_name}.{name}={v}: expected at most {MAX_COUNT_PARAMETER:,}")
        if ("tokens" in name or name == "chunked_prefill_size") and v > MAX_TOKEN_PARAMETER:
            raise WorkloadError(f"{shape_name}.{name}={v}: expected at most {MAX_TOKEN_PARAMETER:,} tokens")
        if name.startswith("max_") and "tokens" not in name and isinstance(v, int) and v > MAX_STEPS_PARAMETER:
            raise WorkloadError(f"{shape_name}.{name}={v}: expected at most {MAX_STEPS_PARAMETER:,}")
        if isinstance(v, int) and v >= 2**31:
            raise WorkloadError(f"{shape_name}.{name}={v}: expected a value below 2**31")
    for name, v in values.items():
        for lo_name, hi_name in ((name, name[:-4] + "_max") if name.endswith("_min") else (None, None),
                                 (name, "max_" + name[4:]) if name.startswith("min_") else (None, None)):
            if lo_name and hi_name in values and v > values[hi_name]:
                raise WorkloadError(f"{shape_name}.{lo_name}={v} > {hi_name}={values[hi_name]}: expected "
                                    f"{lo_name} <= {hi_name}")
    weights = {k: v for k, v in values.items() if k.startswith("weight_")}
    if weights and not sum(weights.values()) > 0:
        raise WorkloadError(f"{shape_name}: the weights {weights} sum to 0; expected at least one > 0")


def generate_workload(
    out: str | os.PathLike,
    options: GenerateOptions,
    config=None,
    overwrite: bool = False,
    progress: bool = False,
) -> Path:
    """Generate a workload and write it to ``out`` (atomically).

    Args:
        out: target directory.
        options: see ``GenerateOptions``.
        config: the shape's config (default: its defaults).
        overwrite: replace an existing directory.
        progress: show progress bars.

    Returns:
        The written directory.
    """
    cols, workload = generate(options, config, progress)
    return write_workload(out, cols, options.hash_block_tokens, workload, overwrite=overwrite)


def _simulate(shape: Shape, cfg, process: ArrivalProcess, options: GenerateOptions, warmup_s: float,
              progress: bool, max_units: int = MAX_PLANNED_UNITS):
    """Start units until no later unit can place a request among the first N arrivals.

    A unit starting at ``t >= cutoff`` (the N-th earliest arrival so far) cannot: its requests
    arrive at ``t`` or later and, on a tie, sort after every earlier unit (larger serial). So the
    loop ends there even when gaps add nothing to ``t``; and it never plans more than
    ``max_units`` units (WorkloadError then, naming what to change).
    """
    n = options.num_requests
    rng = np.random.default_rng(options.seed)
    units: dict[int, object] = {}
    arrivals: list[_Arrival] = []
    t, serial, cutoff = -warmup_s, 0, np.inf
    bar = tqdm(total=n, desc=f"plan {shape.name}", unit="req", disable=not progress, leave=False)
    while True:
        t += process.gap_s(rng)
        if len(arrivals) >= n and (serial % 32 == 0 or cutoff == np.inf):
            cutoff = float(np.partition(np.array([a.at_s for a in arrivals]), n - 1)[n - 1])
        if t >= cutoff:
            break
        if serial >= max_units:
            bar.close()
            raise WorkloadError(
                f"shape {shape.name}: planned {serial:,} units without reaching {n} arrivals "
                f"(arrival clock at {t:.3g} s); expected far fewer: raise --qps, lower --cv or pass "
                "--cold-start")
        unit = shape.plan(cfg, rng, f"{shape.name}/{options.seed}/{serial}")
        kept = 0
        for i, r in enumerate(unit.requests):
            if t + r.offset_s >= 0.0:
                arrivals.append(_Arrival(t + r.offset_s, serial, r.turn, i))
                kept += 1
        if kept:
            units[serial] = unit
            bar.update(min(kept, max(0, n - bar.n)))
        serial += 1
    bar.close()
    arrivals.sort(key=lambda a: (a.at_s, a.serial, a.turn))
    return units, arrivals[:n]


def _materialize(units, arrivals: list[_Arrival], block: int, progress: bool) -> RequestColumns:
    """Turn planned arrivals into columns, with chained page hashes."""
    n = len(arrivals)
    last_s = arrivals[-1].at_s if arrivals else 0.0
    if not last_s * 1e9 < 2**63:  # a heavy-tailed draw far beyond the expected span
        raise WorkloadError(f"the last planned arrival is at {last_s:.3g} s, beyond int64 nanosecond timestamps "
                            "(~292 years): raise --qps or lower --cv")
    ts = np.array([round(a.at_s * 1e9) for a in arrivals], dtype=np.int64)
    session_of: dict[int, int] = {}
    session = np.array([session_of.setdefault(a.serial, len(session_of)) for a in arrivals], dtype=np.int64)
    turn = np.array([a.turn for a in arrivals], dtype=np.int32)
    input_len = np.empty(n, dtype=np.int32)
    output_len = np.empty(n, dtype=np.int32)
    max_new = np.empty(n, dtype=np.int32)
    keys = []
    num_blocks = 0
    for i, a in enumerate(tqdm(arrivals, desc="page hashes", unit="req", disable=not progress, leave=False)):
        unit = units[a.serial]
        r = unit.requests[a.req]
        seg_keys = [unit.segment_key(j) for j in r.prompt]
        seg_tokens = [unit.seg_tokens[j] for j in r.prompt]
        tokens = sum(seg_tokens)
        num_blocks += tokens // block + 1
        if tokens >= 2**31 or num_blocks > MAX_WORKLOAD_BLOCKS:
            raise WorkloadError(f"request {i} has a {tokens:,}-token prompt ({num_blocks:,} hash blocks so far); "
                                f"expected prompts below 2**31 tokens and at most {MAX_WORKLOAD_BLOCKS:,} blocks "
                                "in all: lower the shape's token parameters or --requests, or raise "
                                "--hash-block-tokens")
        input_len[i] = tokens
        output_len[i] = r.output_len
        max_new[i] = r.max_new_tokens
        keys.append(segment_block_keys(seg_keys, seg_tokens, block))
    lengths = np.array([len(k) for k in keys], dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(keys) if keys else np.empty(0, dtype=np.uint64)
    hashes = chain_hashes(flat, lengths)
    return RequestColumns(ts, session, turn, input_len, output_len, max_new, hashes, offsets)


__all__ = ["GenerateOptions", "generate", "generate_workload", "make_config", "DEFAULT_HASH_BLOCK_TOKENS"]
