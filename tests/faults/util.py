"""Helpers of the fault-injection suite: run kvtrace for real, assert a clean failure, and
account for every event of a rank (written + counted lost = issued)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq

KVTRACE = str(Path(sys.executable).parent / "kvtrace")
ROOT = Path(__file__).resolve().parents[2]

# A live recording: emits pool/cache/request rows in rounds, flushes after each round and prints
# the number of events emitted so far (all of them on disk). On SIGINT it prints the final count.
LIVE_CHILD = textwrap.dedent("""
    import sys, time, tracer
    from tracer.schema import CacheOp, Pool, PoolOp, RequestEvent
    tracer.start(sys.argv[1], flush_interval_ms=int(sys.argv[2]), poll_interval_ms=20)
    n = 0
    try:
        while True:
            for i in range(200):
                tracer.pool(Pool.FULL, PoolOp.ALLOC, i, 16, 1)
                tracer.cache(CacheOp.MATCH, i, 16, 0, 0, 16, 0, 0, 1, 0, 0)
                n += 2
            tracer.request(RequestEvent.ARRIVAL, n, -1, -1, 100, 10, 10, -1, "r")
            n += 1
            tracer.flush()
            print(n, flush=True)
            time.sleep(0.002)
    except KeyboardInterrupt:
        print("final", n, flush=True)
        raise
""")


def file_size_limit(nbytes: int):
    """A ``preexec_fn`` making writes past ``nbytes`` fail with EFBIG, as on a full disk."""
    import resource
    import signal

    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return pre


def run(*args, timeout=300, env=None, preexec_fn=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([KVTRACE, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env, preexec_fn=preexec_fn, cwd=cwd)


def assert_clean_failure(res, *needles, code=None) -> None:
    """Non-zero exit (``code`` if given), one ``kvtrace: error:`` message naming ``needles``,
    no Python traceback."""
    err = res.stderr if hasattr(res, "stderr") else res.output
    assert res.returncode != 0 if hasattr(res, "returncode") else res.exit_code != 0, err
    rc = res.returncode if hasattr(res, "returncode") else res.exit_code
    if code is not None:
        assert rc == code, (rc, err)
    assert "Traceback" not in err, err
    for n in needles:
        assert str(n) in err, (n, err)


def accounting(trace_dir: str | Path, rank: int = 0) -> dict:
    """Rows written per family, events counted lost in drops, largest seq, and the rank file."""
    root = Path(trace_dir)
    rows, dropped, max_seq = {}, 0, 0
    for fam_dir in root.iterdir():
        d = fam_dir / f"rank={rank}"
        if not d.is_dir():
            continue
        for p in d.glob("part-*.parquet"):
            t = pq.read_table(p)
            rows[fam_dir.name] = rows.get(fam_dir.name, 0) + t.num_rows
            if t.num_rows:
                max_seq = max(max_seq, max(t.column("seq").to_pylist()))
            if fam_dir.name == "drops":
                dropped += sum(t.column("num_events").to_pylist())
    info_path = root / "ranks" / f"rank={rank}.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    return {"rows": rows, "written": sum(rows.values()), "dropped": dropped, "max_seq": max_seq, "info": info}


def data_events(acc: dict) -> int:
    """Emitted events on disk (drops rows are the recorder's own)."""
    return sum(n for f, n in acc["rows"].items() if f != "drops")


def no_temporaries(root: str | Path) -> list[str]:
    return [str(p) for p in Path(root).rglob("*") if p.is_file() and (p.name.endswith(".tmp") or ".tmp" in p.name)]


def env_without_autoload() -> dict:
    env = dict(os.environ)
    env.pop("KVTRACE_DIR", None)
    return env
