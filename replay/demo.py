"""``make demo``: record a small synthetic event stream with the tracer and inspect it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from click.testing import CliRunner


def record_synthetic(out: Path, num_requests: int = 200) -> None:
    """A small allocator/cache/scheduler stream: prefill, decode, finish per request."""
    import tracer
    from tracer.schema import CacheOp, Mode, Pool, PoolOp, RequestEvent, SchedKind

    tracer.start(out, server={"page_size": 16, "full_pool_tokens": 65536}, hash_block_tokens=16)
    used, step = 0, 0
    for rid in range(num_requests):
        step += 1
        tracer.sched(SchedKind.STEP, step, Mode.PREFILL, 1, 512, 40_000)
        tracer.request(RequestEvent.ARRIVAL, rid, rid // 4, rid % 4, 512, 64, 64, -1, f"req-{rid}",
                       list(range(rid // 4 * 100, rid // 4 * 100 + 32)))
        tracer.cache(CacheOp.MATCH, rid, device_hit=(rid % 4) * 128)
        tracer.pool(Pool.FULL, PoolOp.ALLOC, rid, 512, 32)
        used += 512
        for _ in range(4):
            step += 1
            tracer.sched(SchedKind.STEP, step, Mode.DECODE, 1, 1, 8_000)
            tracer.pool(Pool.FULL, PoolOp.ALLOC, rid, 16, 1)
            used += 16
            tracer.stats(step, Pool.FULL, 65536, 65536 - used, 0, 0, used)
        tracer.pool(Pool.FULL, PoolOp.FREE, rid, 576, 36)
        used -= 576
        tracer.request(RequestEvent.FINISH, rid, rid // 4, rid % 4, 512, 64, 64, (rid % 4) * 128, f"req-{rid}")
    tracer.stop()


def main() -> int:
    from replay.cli import main as cli

    out = Path("out/demo-trace")
    shutil.rmtree(out, ignore_errors=True)
    record_synthetic(out)
    res = CliRunner().invoke(cli, ["inspect", str(out)])
    sys.stdout.write(res.output)
    return res.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
