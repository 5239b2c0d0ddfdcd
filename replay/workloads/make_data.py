"""Regenerate the bundled sample workloads (``make data``), deterministically.

Small samples are committed under ``data/workloads/`` (a few MB in all, for the demo and tests);
``production_1h`` (about an hour of mixed traffic for one server rank, tens of MB) is written
next to them and git-ignored. Every file is a pure function of this module's table below:
running it twice gives byte-identical output. ``data/README.md`` says what each sample is for.

Usage::

    python -m replay.workloads.make_data [--out-dir data/workloads] [--small-only]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from replay.workloads.generate import GenerateOptions, generate_workload
from replay.workloads.mooncake import export_mooncake


@dataclass(frozen=True)
class Sample:
    """One bundled workload: directory name, generator options, whether it is committed."""

    name: str
    options: GenerateOptions
    committed: bool = True
    mooncake_export: bool = False


SAMPLES = (
    Sample("multi_turn", GenerateOptions("multi_turn", 500, seed=1), mooncake_export=True),
    Sample("agentic", GenerateOptions("agentic", 100, seed=1)),
    Sample("shared_prefix", GenerateOptions("shared_prefix", 500, seed=1)),
    Sample("long_context", GenerateOptions("long_context", 30, seed=1)),
    Sample("mixed", GenerateOptions("mixed", 250, seed=1)),
    # ~one hour for one rank at the Mooncake conversation trace's 3.4 req/s
    Sample("production_1h", GenerateOptions("mixed", 12240, qps=3.4, seed=1), committed=False),
)


def main(argv: list[str] | None = None) -> int:
    """Write every sample (the large one unless ``--small-only``); returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=Path("data/workloads"), help="where to write")
    ap.add_argument("--small-only", action="store_true", help="skip the large git-ignored sample")
    args = ap.parse_args(argv)
    progress = sys.stderr.isatty()
    for s in SAMPLES:
        if args.small_only and not s.committed:
            continue
        t0 = time.perf_counter()
        out = generate_workload(args.out_dir / s.name, s.options, overwrite=True, progress=progress)
        if s.mooncake_export:
            export_mooncake(out, args.out_dir / f"{s.name}.mooncake.jsonl", overwrite=True)
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        print(f"{out}: {s.options.num_requests} requests, {size / 1e6:.2f} MB "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
