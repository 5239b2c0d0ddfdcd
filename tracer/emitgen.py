"""Generated emit functions: one per family, compiled at ``tracer.start`` with the recorder's
buffers bound as globals, plus exact-signature no-ops for when recording is off.

Generated rather than written by hand so every family's hot path is the same few bytecodes
with no per-call dispatch; the source of each is ``_gen_emit(...)`` (readable in tests).
"""

from __future__ import annotations

from tracer.schema import FAMILIES, ROW_FAMILIES, Family

# Public emit signatures: (name, family, params with defaults, record expression order).
_EMITS = {
    "pool": "pool, op, rid, num_slots, num_pages=0, dur_ns=0",
    "cache": (
        "op, rid, device_hit=0, host_hit=0, swa_host_hit=0, full_tokens=0, swa_tokens=0, "
        "host_tokens=0, nodes=0, tombstones=0, dur_ns=0"
    ),
    "sched": (
        "kind, forward_ct, mode=0, batch_size=0, num_tokens=0, step_ns=0, rid=-1, prefix_len=0, "
        "extend_len=0, host_hit_len=0, chunk_requested=0, chunk_admitted=0, verdict=0, "
        "rem_total=-1, rem_swa=-1, swa_needed=-1"
    ),
    "stats": "forward_ct, pool, capacity, available, evictable, protected, held",
    "request": (
        "event, rid, session_id=-1, turn=-1, input_len=0, output_len=-1, max_new_tokens=0, "
        "cached_len=-1, rid_str='', page_hashes=None, prefix_rid=-1, prefix_blocks=0, new_blocks=-1, "
        "tip_hash=0"
    ),
    "drops": "family, first_seq, last_seq, num_events, reason, detail=''",
}
_READS_CLOCK = {"sched", "stats", "request", "drops"}  # in clock="step" mode
EMIT_NAMES = ("pool", "pool_ids", "cache", "sched", "stats", "request")


def make_noops() -> dict:
    """Disabled emits with the exact signatures (a ``*args`` no-op costs ~30 ns more)."""
    out = {}
    for name in EMIT_NAMES:
        params = _EMITS["pool"] + ", page_ids=None" if name == "pool_ids" else _EMITS[name]
        ns: dict = {}
        exec(compile(f"def {name}({params}):\n    return None\n", f"<kvtrace noop {name}>", "exec"), ns)
        out[name] = ns[name]
    return out


def _record_fields(fam: Family) -> list[str]:
    return [c.name for c in fam.columns if c.code or fam.name in ROW_FAMILIES]


def _gen_emit(fam_name: str, reads_clock: bool, with_ids: bool = False, ts_in_record: bool = True,
              marks: bool = False) -> str:
    """Source of one emit. ``ts_in_record=False``: the record has no ts (filled at flush from
    clock marks); ``marks``: this emit reads the clock and leaves a mark ``(seq, ts)``."""
    params = _EMITS[fam_name] + (", page_ids=None" if with_ids else "")
    fields = _record_fields(FAMILIES[fam_name])[2:]  # after ts_ns, seq
    args = ", ".join(fields)
    name = "pool_ids" if with_ids else fam_name
    clock = "t = now[0] = mono() - anchor" if reads_clock else "t = now[0]"
    if marks:
        clock += "\n    mark((s, t))"
    if not ts_in_record:
        clock = "pass"
    if fam_name in ROW_FAMILIES:
        return (
            f"def {name}({params}):\n"
            f"    s = next(seq)\n    {clock}\n"
            f"    with lock:\n"
            f"        rows = cur[0]\n"
            f"        if len(rows) < cap:\n"
            f"            rows.append((t, s, {args}))\n"
            f"            return\n"
            f"    full(s, None)\n"
        )
    side = "        side.append((off // size, page_ids))\n" if with_ids else ""
    off = "off = next(ctr)" if with_ids else ""
    slot = "off" if with_ids else "next(ctr)"
    rec = f"t, s, {args}" if ts_in_record else f"s, {args}"
    return (
        f"def {name}({params}):\n"
        f"    s = next(seq)\n    {clock}\n"
        f"    data, ctr, side = cur[0]\n"
        f"    try:\n"
        f"        {off}\n"
        f"        pack(data, {slot}, {rec})\n{side}"
        f"    except error:\n"
        f"        full(s, ({rec}){', page_ids' if with_ids else ''})\n"
    )
