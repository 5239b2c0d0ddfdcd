"""Regenerate the small bundled traces the notebooks and the report tests default to.

    .venv/bin/python data/traces/make_traces.py

* ``workload/``: 120 requests of ``multi_turn`` (seed 7, cold start), the request family only;
* ``ab/``: replays of that workload under ``baseline`` and ``swa-fixes`` with HiCache on and
  small pools (full 65536, SWA 16384, host 131072 tokens): ``ab/baseline`` is the incident
  (pre-fix SWA growth, eager host free), ``ab/swa-fixes`` the replay under the fix. (Plain
  directory names, not ``policy=...``: Polars' hive scan in ``replay.trace`` would read
  ``policy`` as a partition key of every file.)
Deterministic: the replays run on a virtual clock.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETS = ("full_pool_tokens=65536", "swa_pool_tokens=16384", "host_pool_tokens=131072")


def main() -> None:
    wl = HERE / "workload"
    ab = HERE / "ab"
    for d in (wl, ab):
        shutil.rmtree(d, ignore_errors=True)
    kv = str(Path(sys.executable).with_name("kvtrace"))
    subprocess.run([kv, "workload", "generate", "--shape", "multi_turn", "--requests", "120",
                    "--seed", "7", "--cold-start", "--out", str(wl)], check=True)
    from concurrent.futures import ProcessPoolExecutor

    ab.mkdir(parents=True)
    with ProcessPoolExecutor(2) as ex:
        for f in [ex.submit(_replay, wl, ab / p, p) for p in ("baseline", "swa-fixes")]:
            f.result()
    print(f"wrote {wl} and {ab}")


def _replay(source: Path, out: Path, policy: str) -> None:
    from replay.runs import replay_run

    replay_run(source, out, policy=policy, sets=SETS)


if __name__ == "__main__":
    main()
