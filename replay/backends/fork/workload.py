"""kvtrace workloads as request lists for :func:`replay.backends.fork.driver.run_requests`.

Runs in the caller's process (the main venv): reads the workload with
:func:`replay.workloads.read.read_workload` and synthesizes each prompt's token ids from its page
hashes (one hash -> ``hash_block_tokens`` ids, :func:`replay.backends.fork.driver.synth_tokens`),
so requests that share page hashes share token prefixes and nothing else does; the tail past the
last full page comes from the rid. Scaling down keeps prefix sharing: a prompt is cut to
``max_input_tokens`` (whole pages first), ``max_new_tokens`` is capped.
"""

from __future__ import annotations

import os

from replay.backends.fork.driver import synth_tokens


def requests_from_workload(path: str | os.PathLike, *, max_requests: int | None = None,
                           max_input_tokens: int = 2048, max_new_tokens: int = 64,
                           step_ns: int = 50_000_000) -> list[dict]:
    """The first ``max_requests`` arrivals of the workload at ``path`` as request dicts.

    Args:
        step_ns: virtual time of one scheduler step: arrival step = (ts - first ts) // step_ns.
    """
    from replay.workloads.read import read_workload

    w = read_workload(path)
    c = w.columns
    block = int(w.hash_block_tokens)
    n = c.num_requests if max_requests is None else min(max_requests, c.num_requests)
    rids = [str(r) for r in c.rids()]
    if c.rid_str is not None and len(set(c.rid_str[:n])) == n and all(c.rid_str[:n]):
        rids = list(c.rid_str)
    t0 = int(c.ts_ns[0]) if n else 0
    out = []
    for i in range(n):
        length = min(int(c.input_len[i]), max_input_tokens)
        ids: list[int] = []
        for h in c.hashes_of(i):
            if len(ids) + block > length:
                break
            ids.extend(synth_tokens(f"page:{int(h)}", block))
        ids.extend(synth_tokens(f"tail:{rids[i]}", length - len(ids)))
        want = int(c.output_len[i]) if int(c.output_len[i]) > 0 else int(c.max_new_tokens[i])
        out.append({"rid": str(rids[i]), "input_ids": ids, "max_new_tokens": max(1, min(want, max_new_tokens)),
                    "arrival_step": (int(c.ts_ns[i]) - t0) // step_ns})
    return out


__all__ = ["requests_from_workload"]
