"""Regenerate the incident traces of ``data/incidents/`` (``python -m replay.diagnosis.make_incidents``).

Every trace is recorded on the real sglang 0.5.23 classes through
``replay.record.record_workload`` (``--detail pages``), from small deterministic workloads built
here, with either a pre-fix setting of the backend or a planted bug of
``replay.backends.sglang.incidents``. Each incident has a healthy twin: the same workload under
the same sizes with the fix (0.5.23's own behaviour). ``INCIDENTS`` is the table the README and
the tests read: name -> (workload, settings, ``SGLANG_*`` switches, planted bug, expected doctor
cause). ``env`` holds sglang switches the backend settings have no knob for
(``SGLANG_OPT_RELEASE_PREFILL_SWA``); they are set around the recording and written to
``backend.json`` (``env``), where ``doctor --replay`` reads them back.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

BLOCK = 16
ROOT = Path(__file__).resolve().parents[2] / "data" / "incidents"
BASE = ("tree_core=rust", "page_size=16", "sliding_window_tokens=32", "full_pool_tokens=16384",
        "swa_pool_tokens=2048", "chunked_prefill_size=256", "max_running_requests=8")
# page 64 > window 32 (the #29860 / #22470 case); the planted insert bug needs the Python core
PAGE64 = ("tree_core=python", "page_size=64", "sliding_window_tokens=32", "full_pool_tokens=16384",
          "swa_pool_tokens=2048", "chunked_prefill_size=256", "max_running_requests=8",
          "swa_eviction_interval_tokens=16")
PRE_29860 = "swa_release_boundary=window_plus_page_cut_to_window"
RELEASE_PREFILL_SWA = {"SGLANG_OPT_RELEASE_PREFILL_SWA": "true"}


@dataclass(frozen=True)
class Incident:
    name: str
    workload: str  # key of WORKLOADS
    sets: tuple[str, ...]
    incident: str = ""
    every: int = 3
    env: tuple[tuple[str, str], ...] = ()  # SGLANG_* switches set around the recording
    cause: str = ""  # the cause doctor must name ("" = healthy)
    what: str = ""


def _blocks(tag, n: int) -> list[int]:
    out = []
    for i in range(n):
        d = hashlib.blake2b(repr((tag, i)).encode(), digest_size=8).digest()
        out.append(int.from_bytes(d, "little") >> 1 | 1)
    return out


def _multi_turn(sessions: int, turns: int, user_blocks: int, out: int, gap_ms: float) -> list[dict]:
    rows, rid = [], 0
    system = _blocks("system", 8)
    for s in range(sessions):
        hist = list(system)
        for t in range(turns):
            hist = hist + _blocks(("user", s, t), user_blocks)
            rows.append(dict(rid=rid, ts_ns=int((t * sessions + s) * gap_ms * 1e6), page_hashes=list(hist),
                             input_len=len(hist) * BLOCK, output_len=out, max_new_tokens=out,
                             session_id=s, turn=t))
            hist = hist + _blocks(("answer", s, t), max(1, out // BLOCK))
            rid += 1
    return rows


def _varied_answers(sessions: int, turns: int, user_blocks: int, outs: tuple[int, ...],
                    gap_ms: float, seed: int) -> list[dict]:
    """Multi-turn rows whose answer lengths are drawn (seeded) from ``outs``: with page 64 and
    window 32, a sequence ending 33..63 tokens into a page is where the pre-#29860 frontier
    reaches the page floor of the insert."""
    rows = _multi_turn(sessions, turns, user_blocks, max(outs), gap_ms)
    rng = random.Random(seed)
    for r in rows:
        r["output_len"] = r["max_new_tokens"] = rng.choice(outs)
    return rows


WORKLOADS = {
    # short answers: 30 requests over 10 sessions
    "chat": lambda: _multi_turn(10, 3, 6, 12, 250.0),
    # long answers (decode well past the window)
    "long_answers": lambda: _multi_turn(6, 3, 4, 160, 1500.0),
    # long prompts (chunked prefill: 4-9 chunks of 256)
    "long_prompts": lambda: _multi_turn(6, 2, 60, 12, 500.0),
    # long decodes (400 tokens, 12x the window)
    "long_decodes": lambda: _multi_turn(6, 3, 4, 400, 3000.0),
    # answers of 100..250 tokens (page 64: some end past the window inside their last page)
    "varied_answers": lambda: _varied_answers(6, 3, 4, (100, 110, 120, 230, 240, 250), 1500.0, 1),
}

INCIDENTS = (
    Incident("healthy_chat", "chat", BASE, what="healthy twin of lost_free / lost_unlock"),
    Incident("lost_free", "chat", BASE, incident="lost_free", cause="slots_lost_by_allocator",
             what="planted lost free: every 3rd SWA segment free outside a free group loses its last page"),
    Incident("lost_unlock", "chat", BASE, incident="lost_unlock", every=5, cause="protected_prefix_pinned",
             what="planted lost unlock: every 5th lock receipt is never released; its prefix stays protected"),
    Incident("healthy_long_answers", "long_answers", BASE + ("swa_eviction_interval_tokens=16",),
             what="healthy twin of swa_mapping_race / private_range_kept"),
    Incident("swa_mapping_race", "long_answers", BASE + ("swa_eviction_interval_tokens=16",),
             incident="swa_mapping_race", cause="slots_lost_by_allocator",
             what="sgl-project/sglang#36135: SWA peer resolved at free_group_end after its mapping was cleared; one page lost per 3rd grouped free"),
    Incident("private_range_kept", "long_answers", BASE + ("swa_eviction_interval_tokens=1000000",),
             cause="private_range_kept_until_finish",
             what="decode never frees out-of-window SWA (eviction interval past every answer): the private range stays until finish"),
    Incident("healthy_long_prompts", "long_prompts", BASE, what="healthy twin of unfinished_insert"),
    Incident("unfinished_insert", "long_prompts", BASE + ("swa_free_out_of_window_at_insert=false",),
             cause="unfinished_insert_without_release",
             what="pre-#27402: chunked prefill inserts every chunk as live, locked SWA (no out-of-window free at insert)"),
    Incident("healthy_window_release", "long_decodes", BASE + ("swa_eviction_interval_tokens=16",),
             env=tuple(RELEASE_PREFILL_SWA.items()),
             what="healthy twin of window_lock: SGLANG_OPT_RELEASE_PREFILL_SWA=true releases the prefill window lock once decode is a window past it"),
    Incident("window_lock", "long_decodes", BASE + ("swa_eviction_interval_tokens=16",),
             cause="window_lock_held_through_decode",
             what="0.5.23 default SGLANG_OPT_RELEASE_PREFILL_SWA=false: each request's prefill window lock stays through 400 decode tokens"),
    Incident("healthy_tombstone_leaf", "varied_answers", PAGE64,
             what="healthy twin of all_tombstone_leaf (0.5.23: max(W, ps) boundary)"),
    Incident("tombstone_boundary_only", "varied_answers", PAGE64 + (PRE_29860,),
             what="pre-#29860 boundary alone on 0.5.23: 8 finished inserts are fully out of window, but 0.5.23's insert makes them plain tombstones (no leak)"),
    Incident("all_tombstone_leaf", "varied_answers", PAGE64 + (PRE_29860,), incident="all_tombstone_leaf_insert",
             every=1, cause="all_tombstone_last_leaf",
             what="sgl-project/sglang#29860 + pre-#22470 insert: the frontier reaches page_floor(seq_len) and the fully out-of-window last leaf is inserted as live SWA (identity broken, SWA over-counted)"),
)


@contextlib.contextmanager
def sglang_switches(env: dict[str, str]):
    """Set ``SGLANG_*`` switches for the block (sglang reads them at call time); restore after."""
    bad = [k for k in env if not k.startswith("SGLANG_")]
    if bad:
        raise ValueError(f"env {bad}: only SGLANG_* switches can be set")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def make(names: tuple[str, ...] = (), root: Path = ROOT, progress: bool = True) -> list[dict]:
    """Record the incident traces (all, or ``names``) under ``root``; returns their summaries."""
    from replay.backends.sglang import write_workload
    from replay.record import record_workload

    root.mkdir(parents=True, exist_ok=True)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for inc in INCIDENTS:
            if names and inc.name not in names:
                continue
            w = write_workload(Path(tmp) / inc.workload, WORKLOADS[inc.workload](), hash_block_tokens=BLOCK)
            dest = root / inc.name
            shutil.rmtree(dest, ignore_errors=True)
            with sglang_switches(dict(inc.env)):
                # On the mirror scheduler: sglang's own Scheduler runs its idle memory check
                # (SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE, on by default in 0.5.23) and raises
                # "pool memory leak detected!" on the planted leaks, as a real server would; the
                # mirror drives the same pool and tree code, so the planted bug stays the one change.
                s = record_workload(w, dest, overrides=inc.sets + ("scheduler=mirror",), detail="pages",
                                    incident=inc.incident, incident_every=inc.every)
            s["env"] = dict(inc.env)
            s["workload"] = inc.workload
            s["trace"] = f"data/incidents/{inc.name}"
            (dest / "backend.json").write_text(json.dumps(s, indent=1, default=str))
            size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
            if progress:
                print(f"{inc.name}: {s['result']['num_finished']} finished, "
                      f"{s.get('incident', {}).get('planted', 0)} planted, {size / 1e3:.0f} kB", flush=True)
            out.append(s)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="incidents to record (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT)
    a = ap.parse_args(argv)
    make(tuple(a.names), a.out)


if __name__ == "__main__":
    main()
