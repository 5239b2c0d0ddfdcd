"""One sweep run in its own process: ``python -m replay.runs.worker JOB.json``.

``JOB.json`` (written by :func:`replay.runs.sweep._run_local`) names the source, sweep root,
policy, grid point, overrides, backend and detail; the result (``{"run", "status", "error"}``)
goes to ``JOB.result.json`` next to it. Patches and tracer hooks live and die with this process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from replay.runs.sweep import RunSpec, _run_one

    job = Path((argv or sys.argv[1:])[0])
    spec_data = json.loads(job.read_text())
    spec = RunSpec(spec_data["policy"], tuple((k, v) for k, v in spec_data["grid"]))
    try:
        res = _run_one(spec_data["source"], spec_data["root"], spec, tuple(spec_data["sets"]),
                       spec_data["backend"], spec_data["detail"])
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # Interrupted (a KvtraceError) from replay_run
        print(f"kvtrace worker: {e}", file=sys.stderr)
        return 130
    job.with_suffix("").with_suffix(".result.json").write_text(json.dumps(res))
    return 0 if res["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
