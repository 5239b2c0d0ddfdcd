"""``make demo``: the main job end to end on bundled data.

1. summarize a bundled workload (``kvtrace workload stats``);
2. record it through the real sglang 0.5.23 pools, radix cache and admission code on CPU with
   the tracer hooks installed (``kvtrace record``), with pool sizes that put the SWA and full
   pools under pressure and HiCache on;
3. inspect and check the trace: every family but ``drops`` non-empty, zero drops, no problems;
4. replay the trace (a trace is a workload, its manifest the ``recorded`` settings) under
   ``baseline`` (every pre-fix behaviour) and ``swa-fixes`` (sglang 0.5.23), two processes at
   once (``kvtrace sweep``), and print the comparison (``kvtrace compare``);
5. write the self-contained HTML report of the trace and the runs (``kvtrace report``) and print
   its path.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from click.testing import CliRunner

from replay.paths import data_dir

DEFAULT_WORKLOAD = data_dir() / "workloads" / "multi_turn"  # through the package: checkout or installed
#: Sizes under which the fixes visibly matter on the multi_turn sample: a full pool of 128k
#: tokens, an SWA pool of 32k (W = 128) and a host pool of 1M slots (HiCache write-through).
DEMO_SETTINGS = ("full_pool_tokens=131072", "swa_full_tokens_ratio=0.25", "host_pool_tokens=1048576")
MARKER = ".kvtrace-demo"


def _run(args: list[str], *, echo: bool = True) -> str:
    from replay.cli import main as cli

    if echo:
        print(f"$ kvtrace {' '.join(args)}", flush=True)
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    if res.exit_code != 0:
        raise SystemExit(f"kvtrace {' '.join(args)} failed ({res.exit_code}):\n{res.output}")
    return res.output


def _fresh(out: Path) -> None:
    """Make ``out`` an empty demo directory; refuse to delete a directory the demo did not make."""
    if out.exists():
        if not (out / MARKER).is_file():
            raise SystemExit(f"{out} exists and was not made by the demo; choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("made by make demo; deleted by the next run\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    ap.add_argument("--out", type=Path, default=Path("out/demo"))
    ap.add_argument("--set", action="append", default=list(DEMO_SETTINGS), help="knob KNOB=VALUE")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)

    _fresh(args.out)
    trace, runs = args.out / "trace", args.out / "runs"
    sys.stdout.write(_run(["workload", "stats", str(args.workload)]))
    sets = [x for kv in args.set for x in ("--set", kv)]
    sys.stdout.write(_run(["record", "--workload", str(args.workload), "--backend", "sglang",
                           "--out", str(trace), *sets]))
    sys.stdout.write(_run(["inspect", str(trace)]))
    summary = json.loads(_run(["inspect", str(trace), "--json"], echo=False))
    empty = [f for f, n in summary["families"].items() if f != "drops" and n == 0]
    if empty or summary["drops"] or summary["problems"]:
        print(f"demo check FAILED: empty families {empty}, drops {summary['drops']}, "
              f"problems {summary['problems']}")
        return 1
    print(f"demo check ok: {sum(summary['families'].values()):,} events, 0 drops, "
          f"{summary['bytes_per_event']} bytes/event -> {trace}\n")
    sys.stdout.write(_run(["sweep", str(trace), "--policies", "baseline,swa-fixes", "--jobs", str(args.jobs),
                           "--out", str(runs), "--quiet"]))
    sys.stdout.write(_run(["compare", str(runs), "--base", "baseline"]) + "\n")
    report = args.out / "report.html"
    _run(["report", str(args.out), "--out", str(report)])
    print(f"report: {report.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
