"""Drive the fork's own Scheduler over a list of requests (runs in the fork's process).

:func:`run_requests` is the entry point (``call_in_code(code, "replay.backends.fork.driver:run_requests",
{...})``): it builds the pools (:mod:`replay.backends.fork.dsv4_pools`) and the Scheduler
(:mod:`replay.backends.fork.scheduler`), then steps as the fork's ``event_loop_normal`` does:
arrivals (``process_input_requests`` with ``TokenizedGenerateReqInput``) →
``get_next_batch_to_run()`` → ``run_batch`` → ``process_batch_result`` → ``last_batch`` set by
hand; ``on_idle`` when no batch. After the last request finishes, ``flush_cache()``.

A request is ``{"rid", "input_ids" | "input_len", "max_new_tokens", "arrival_step"}``. Without
``input_ids`` the prompt is synthesized per rid (:func:`synth_tokens`), so unrelated requests share
no page. Output tokens are deterministic and never EOS (ids >= 2).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter

#: Token ids are drawn in [2, VOCAB) (0 = bos, 1 = eos of the tiny configs).
VOCAB = 1024


def synth_tokens(key: str, n: int, *, vocab: int = VOCAB) -> list[int]:
    """``n`` deterministic token ids for ``key`` (a rid, a page hash), in ``[2, vocab)``."""
    out: list[int] = []
    counter = 0
    while len(out) < n:
        digest = hashlib.blake2b(f"{key}:{counter}".encode(), digest_size=32).digest()
        out.extend(2 + int.from_bytes(digest[i:i + 2], "little") % (vocab - 2) for i in range(0, 32, 2))
        counter += 1
    return out[:n]


class _Sink:
    """Stands in for the scheduler's ZMQ sockets: counts what is sent, by type."""

    def __init__(self) -> None:
        self.sent: Counter = Counter()

    def send_pyobj(self, obj, *args, **kwargs) -> None:
        self.sent[type(obj).__name__] += 1


def _next_token(req) -> int:
    return 2 + (len(req.output_ids) * 7 + len(req.origin_input_ids)) % (VOCAB - 2)


def _tokenized(req: dict):
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    rid = str(req["rid"])
    ids = list(req["input_ids"]) if req.get("input_ids") is not None else synth_tokens(rid, int(req["input_len"]))
    sp = SamplingParams(max_new_tokens=int(req["max_new_tokens"]), temperature=0.0, ignore_eos=True)
    sp.normalize(None)
    return TokenizedGenerateReqInput(rid=rid, input_text="", input_ids=ids, mm_inputs=None, sampling_params=sp,
                                     return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
                                     token_ids_logprob=None, stream=False)


def _available(sched) -> dict:
    from replay.backends.fork.dsv4_pools import available

    return available(sched.token_to_kv_pool_allocator)


def _pools(sched) -> dict:
    from replay.backends.fork.dsv4_pools import describe_pools

    runner = sched.tp_worker.model_runner
    out = describe_pools(runner.token_to_kv_pool, sched.token_to_kv_pool_allocator, runner.req_to_token_pool)
    out["configurator"] = getattr(runner, "configurator_name", None)
    tree = sched.tree_cache
    out["tree"] = type(tree).__name__
    ctrl = getattr(tree, "cache_controller", None)
    if ctrl is not None:
        host = getattr(ctrl, "mem_pool_host", None)
        out["host_pool"] = type(host).__name__ if host is not None else None
        entries = getattr(host, "entries", None) or []
        out["host_entries"] = {str(getattr(e, "name", i)): type(getattr(e, "host_pool", e)).__name__
                               for i, e in enumerate(entries)}
        anchor = getattr(host, "anchor_entry", None)
        if anchor is not None:
            out["host_anchor"] = type(anchor.host_pool).__name__
            out["host_anchor_tokens"] = int(getattr(anchor.host_pool, "size", 0))
    return out


def run_requests(requests: list[dict], *, kind: str = "dsv4", max_total_tokens: int = 16384,
                 swa_full_tokens_ratio: float | None = None, page_size: int | None = None,
                 hicache_host_tokens: int = 0, max_running_requests: int = 16, chunked_prefill_size: int = 512,
                 max_prefill_tokens: int = 4096, context_length: int = 8192, sliding_window_tokens: int = 128,
                 max_steps: int = 100_000, env: dict | None = None, sample_every_steps: int = 1) -> dict:
    """Run ``requests`` to completion on the fork's Scheduler; returns a JSON-able summary.

    Returns:
        ``{"pools", "steps", "prefill_steps", "decode_steps", "idle_steps", "chunked_steps",
        "finished", "cached_tokens", "available" (per sampled step), "min_available",
        "after_flush", "flushed", "sent", "wall_s"}``.
    Raises:
        RuntimeError: requests left unfinished after ``max_steps``.
    """
    import torch

    from replay.backends.fork.scheduler import build_scheduler

    for k, v in (env or {}).items():
        os.environ[k] = str(v)
    t0 = time.perf_counter()
    _, sched = build_scheduler(kind, sliding_window_tokens=sliding_window_tokens, next_token=_next_token,
                               max_total_tokens=max_total_tokens, page_size=page_size,
                               swa_full_tokens_ratio=swa_full_tokens_ratio,
                               max_running_requests=max_running_requests,
                               chunked_prefill_size=chunked_prefill_size, max_prefill_tokens=max_prefill_tokens,
                               context_length=context_length, hicache_host_tokens=hicache_host_tokens)
    sink = _Sink()
    for name in ("send_to_tokenizer", "send_to_detokenizer"):
        getattr(sched.ipc_channels, name).socket = sink
    build_s = time.perf_counter() - t0

    pending = sorted(requests, key=lambda r: int(r.get("arrival_step", 0)))
    if len({str(r["rid"]) for r in pending}) != len(pending):
        raise ValueError("run_requests: request rids must be unique")
    reqs: dict = {}
    finished: dict = {}
    counts = Counter()
    samples, cursor = [], 0
    initial = _available(sched)
    mins = dict(initial)
    with torch.no_grad():
        for step in range(max_steps):
            arrivals = []
            while cursor < len(pending) and int(pending[cursor].get("arrival_step", 0)) <= step:
                arrivals.append(_tokenized(pending[cursor]))
                cursor += 1
            if arrivals:
                before = len(sched.waiting_queue)
                sched.process_input_requests(arrivals)
                for r in sched.waiting_queue[before:]:
                    reqs[r.rid] = r
            batch = sched.get_next_batch_to_run()
            if batch is None:
                counts["idle"] += 1
                sched.on_idle()
            else:
                mode = "prefill" if batch.forward_mode.is_extend() else "decode"
                counts[mode] += 1
                if mode == "prefill" and sched.chunked_req is not None:
                    counts["chunked"] += 1
                result = sched.run_batch(batch)
                sched.process_batch_result(batch, result)
            sched.last_batch = batch
            avail = _available(sched)
            for k, v in avail.items():
                mins[k] = min(mins[k], v)
            if step % max(sample_every_steps, 1) == 0:
                samples.append([step, *avail.values()])
            for rid in [rid for rid, r in reqs.items() if r.finished()]:
                r = reqs.pop(rid)
                finished[rid] = {"output_tokens": len(r.output_ids), "cached_tokens": int(r.cached_tokens),
                                 "reason": type(r.finished_reason).__name__}
            if cursor >= len(pending) and not reqs and not sched.waiting_queue and sched.running_batch.is_empty():
                break
        else:
            raise RuntimeError(f"{len(reqs) + len(pending) - cursor} request(s) unfinished after {max_steps} steps")
        flushed = bool(sched.flush_cache())
    after = _available(sched)
    return {"pools": _pools(sched), "initial": initial, "steps": step + 1, "prefill_steps": counts["prefill"],
            "decode_steps": counts["decode"], "idle_steps": counts["idle"], "chunked_steps": counts["chunked"],
            "finished": finished, "num_finished": len(finished),
            "cached_tokens": sum(f["cached_tokens"] for f in finished.values()),
            "available_keys": list(initial), "available": samples, "min_available": mins,
            "after_flush": after, "flushed": flushed, "sent": dict(sink.sent),
            "build_s": round(build_s, 3), "wall_s": round(time.perf_counter() - t0, 3)}


__all__ = ["VOCAB", "run_requests", "synth_tokens"]


def run_cases(cases: list[dict]) -> list[dict]:
    """:func:`run_requests` for each ``{"requests": [...], **options}`` in one process (one import)."""
    out = []
    for case in cases:
        case = dict(case)
        summary = run_requests(case.pop("requests"), **case)
        out.append(summary)
    return out
