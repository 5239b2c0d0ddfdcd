"""``make demo``: the main job end to end on bundled data.

1. summarize a bundled workload (``kvtrace workload stats``);
2. record it through the real sglang 0.5.23 pools, radix cache and admission code on CPU with
   the tracer hooks installed (``kvtrace record --backend sglang``);
3. inspect the trace (``kvtrace inspect``) and check it: every family but ``drops`` non-empty,
   zero drops, no problems.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from click.testing import CliRunner

DEFAULT_WORKLOAD = Path(__file__).resolve().parents[1] / "data" / "workloads" / "multi_turn"


def _run(args: list[str]) -> str:
    from replay.cli import main as cli

    print(f"$ kvtrace {' '.join(args)}", flush=True)
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    if res.exit_code != 0:
        raise SystemExit(f"kvtrace {' '.join(args)} failed ({res.exit_code}):\n{res.output}")
    return res.output


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    ap.add_argument("--out", type=Path, default=Path("out/demo-trace"))
    ap.add_argument("--set", action="append", default=[], help="backend setting KEY=VALUE")
    args = ap.parse_args(argv)

    sys.stdout.write(_run(["workload", "stats", str(args.workload)]))
    shutil.rmtree(args.out, ignore_errors=True)
    sets = [x for kv in args.set for x in ("--set", kv)]
    sys.stdout.write(_run(["record", "--workload", str(args.workload), "--backend", "sglang",
                           "--out", str(args.out), *sets]))
    sys.stdout.write(_run(["inspect", str(args.out)]))
    summary = json.loads(_run(["inspect", str(args.out), "--json"]))
    empty = [f for f, n in summary["families"].items() if f != "drops" and n == 0]
    if empty or summary["drops"] or summary["problems"]:
        print(f"demo check FAILED: empty families {empty}, drops {summary['drops']}, "
              f"problems {summary['problems']}")
        return 1
    print(f"demo check ok: {sum(summary['families'].values()):,} events, 0 drops, "
          f"{summary['bytes_per_event']} bytes/event -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
