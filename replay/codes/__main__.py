"""``python -m replay.codes prepare SPEC... [--json]``: prepare codes (what ``make fork-env`` runs;
SPEC as :func:`replay.codes.prepare` takes it, ``sglang==X`` included)."""

from __future__ import annotations

import argparse
import json
import sys

from replay.codes.prepare import CodePrepareError, prepare


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replay.codes")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="unpack and install the overlay of each code (cached by content)")
    p.add_argument("specs", nargs="+",
                   help="tarball, directory holding python/sglang or sglang/, or sglang==X (a PyPI release)")
    p.add_argument("--json", action="store_true", help="one JSON object per code")
    args = ap.parse_args(argv)
    rc = 0
    for spec in args.specs:
        try:
            env = prepare(spec)
        except CodePrepareError as exc:
            print(f"error: {exc}", file=sys.stderr)
            rc = 1
            continue
        if args.json:
            print(json.dumps(env.as_dict()))
        else:
            state = "cached" if env.cached else "prepared"
            pins = ", ".join(env.pins) or "none"
            print(f"{spec}: {state} in {env.prepare_s:.2f} s -> {env.python_dir} (overlay pins: {pins})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
