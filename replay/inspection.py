"""What ``kvtrace inspect`` shows: manifest, rows per family, ranks and how each ended, span,
drops, bytes on disk, and problems (the full ``Trace.check()`` when ``strict``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from tracer.schema import FAMILIES
from tracer.schema import manifest as _manifest

# Order used to pick the state shown for a whole trace: the worst of its ranks.
# ``partial``: the hooks covered part of the code; ``uncovered``: none of it (rank files'
# ``coverage``, the manifest's ``uncovered``; docs/capture.md "Coverage").
_STATE_ORDER = ("complete", "partial", "recovered", "interrupted", "recording", "crashed",
                "uncovered", "unknown")


def rank_states(trace) -> dict[int, str]:
    """How each rank ended: complete | partial | uncovered | interrupted | crashed | recovered |
    recording | unknown."""
    from replay.trace_checks import rank_info

    out = {}
    for r in trace.ranks:
        info, _ = rank_info(trace, r)
        out[r] = _manifest.end_state(info, _manifest.rank_is_live(trace.path, r, info))
    return out


def rank_coverage(trace) -> dict[int, dict]:
    """Each rank file's ``coverage`` (the sglang hooks': target, fingerprint, hook states...)."""
    from replay.trace_checks import rank_info

    out = {}
    for r in trace.ranks:
        info, _ = rank_info(trace, r)
        cov = (info or {}).get("coverage")
        if isinstance(cov, dict):
            out[r] = cov
    return out


def trace_state(states: dict[int, str], has_rank_files: bool, uncovered: list | None = None) -> str:
    """The worst rank state; ``uncovered`` when some process recorded nothing for lack of
    coverage (the manifest's ``uncovered``) and no rank is worse."""
    if uncovered:
        states = dict(states, uncovered="uncovered")
        has_rank_files = True
    if not has_rank_files:
        return "complete"  # a workload or an imported trace: written whole, atomically
    if not states:
        return "unknown"
    return max(states.values(), key=lambda s: _STATE_ORDER.index(s) if s in _STATE_ORDER else len(_STATE_ORDER))


def summarize(path: str | Path, strict: bool = False) -> dict:
    """Summary of a trace (the ``--json`` object of ``kvtrace inspect``).

    Args:
        path: trace directory.
        strict: run the full checks (``Trace.check()``) rather than only what opening finds.
    Raises:
        TraceError: not a trace, a manifest that is not an object, an unknown major version.
    """
    from replay.trace import open_trace

    tr = open_trace(path, strict=False)
    families = {f: tr.rows(f) for f in FAMILIES}
    lo, hi = None, None
    for seg in tr.segments:
        md = pq.ParquetFile(seg.path).metadata
        col = md.schema.to_arrow_schema().get_field_index("ts_ns")
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(col).statistics
            if st is not None and st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
    num_bytes = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    events = sum(families.values())
    states = rank_states(tr)
    has_rank_files = (Path(path) / _manifest.RANKS_DIR).is_dir()
    uncovered = _manifest.uncovered_processes(tr.manifest)
    if not has_rank_files and isinstance(tr.manifest.get("launch"), dict) and not uncovered:
        # a launched server none of whose processes recorded: never an empty "complete"
        uncovered = [{"pid": tr.manifest["launch"].get("pid"), "argv": [],
                      "reason": "no server process recorded (no hooks installed or run)"}]
    problems = tr.check() if strict else tr.problems
    return {
        "path": str(Path(path)),
        "schema_version": tr.manifest.get("schema_version"),
        "producer": tr.manifest.get("producer"),
        "server": tr.manifest.get("server", {}),
        "hash_block_tokens": tr.manifest.get("hash_block_tokens"),
        "chain_storage": tr.manifest.get("chain_storage") or "hashes",  # positions: `kvtrace compact`
        "state": trace_state(states, has_rank_files, uncovered),
        "coverage": {str(r): c for r, c in rank_coverage(tr).items()},
        "uncovered": uncovered,
        "rank_states": {str(r): s for r, s in states.items()} if has_rank_files else {},
        "families": families,
        "ranks": tr.ranks,
        "span_ns": (hi - lo) if lo is not None else 0,
        "drops": tr.num_dropped,
        "bytes": num_bytes,
        "bytes_per_event": round(num_bytes / events, 3) if events else None,
        "mb_per_rank_hour": mb_per_rank_hour(num_bytes, len(tr.ranks), (hi - lo) if lo is not None else 0),
        "unreadable_files": sorted(str(p) for p in Path(path).rglob("*.unreadable")),
        "problems": [str(p) for p in problems],
    }


def mb_per_rank_hour(num_bytes: int, num_ranks: int, span_ns: int) -> float | None:
    """Disk cost of a recording: MB (10^6 bytes) / ranks / span in hours (None: no span)."""
    if span_ns <= 0:
        return None
    return round(num_bytes / 1e6 / max(num_ranks, 1) / (span_ns / 3.6e12), 3)


def coverage_lines(cov: dict) -> list[str]:
    """A rank's ``coverage`` (``tracer.sglang.targets.coverage``) as text lines (``kvtrace
    hooks check``, ``kvtrace inspect``)."""
    fp = cov.get("fingerprint")
    lines = [f"target     {cov.get('target') or '(none)'}  ({cov.get('reason', '')})",
             f"sglang     {cov.get('sglang_version') or '?'} at {cov.get('sglang_root') or '?'}",
             f"source     fingerprint {fp or '?'} "
             f"({'known' if cov.get('fingerprint_known') else 'unknown'})",
             f"coverage   {cov.get('state')} at level {cov.get('level')}"
             + ("  (--partial)" if cov.get("partial") else "")]
    lines.append(f"{'hook':<20} {'state':<10} reason")
    for name, h in (cov.get("hooks") or {}).items():
        lines.append(f"{name:<20} {h.get('state', '?'):<10} {h.get('reason', '')}".rstrip())
    lines.append(f"{'pool':<20} {'accounted':<10} reason")
    for name, p in (cov.get("pools") or {}).items():
        lines.append(f"{name:<20} {'yes' if p.get('accounted') else 'no':<10} "
                     f"{p.get('reason', '')}".rstrip())
    return lines


__all__ = ["summarize", "rank_states", "rank_coverage", "trace_state", "mb_per_rank_hour",
           "coverage_lines"]
