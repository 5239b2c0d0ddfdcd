"""One run of a sweep, as its worker process runs it: the run's spec (policy, grid point, code)
and directory, the worker body (replay into a partial directory, then move it into place) and
the result it leaves next to its job file.

Its own module so that the sweep (``replay.runs.sweep``), its process pool (``pool``), the warm
zygote (``zygote``) and the worker (``worker``) import it without importing each other.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from replay import knobs
from replay.runs.replay import SUMMARY_FILE, RunError

PARTIAL_DIR = ".partial"
SWEEP_FILE = "sweep.json"
#: a grid key ``env.NAME`` sets the environment variable NAME of a code's process per grid point
ENV_PREFIX = "env."


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its policy, grid values and directory (relative to the sweep root)."""

    policy: str
    grid: tuple[tuple[str, object], ...]
    #: the code's name (``--code name=SPEC``) and spec; "" = the installed sglang (no code level)
    code: str = ""
    code_spec: str = ""

    @property
    def rel_dir(self) -> Path:
        parts = ([f"code={self.code}"] if self.code else []) + [f"policy={self.policy}"]
        parts += [f"{k}={_fmt(v)}" for k, v in self.grid]
        return Path(*parts)

    @property
    def knob_grid(self) -> dict:
        """The grid values that are knobs (not ``env.NAME`` switches)."""
        return {k: v for k, v in self.grid if not k.startswith(ENV_PREFIX)}

    @property
    def env_grid(self) -> dict:
        """The grid's ``env.NAME`` values, as environment entries of the code's process."""
        return {k[len(ENV_PREFIX):]: str(v) for k, v in self.grid if k.startswith(ENV_PREFIX)}

    @property
    def key(self) -> str:
        return str(self.rel_dir).replace(os.sep, "/")


def _fmt(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def run_one(source: str, root: str, spec: RunSpec, sets: tuple, backend: str, detail: str) -> dict:
    """Worker body (a fresh process): run ``spec`` into a partial dir, then move it into place."""
    from replay.runs.replay import replay_run

    final = Path(root) / spec.rel_dir
    partial = Path(root) / PARTIAL_DIR / f"{spec.key.replace('/', '__')}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.parent.mkdir(parents=True, exist_ok=True)
    overrides = dict(knobs.parse_sets(sets)) | spec.knob_grid
    t0 = time.perf_counter()
    try:
        code_kw = {"code": f"{spec.code}={spec.code_spec}", "env": sweep_env(root) | spec.env_grid} if spec.code else {}
        summary = replay_run(source, partial, policy=spec.policy, sets=overrides, backend=backend, detail=detail,
                             model=sweep_model(root), **code_kw)
    except Exception as e:  # reported as a failed run; the others go on
        from replay.errors import Interrupted

        if isinstance(e, Interrupted):
            raise
        msg = str(e) if isinstance(e, RunError) else f"{type(e).__name__}: {e}"
        return {"run": spec.key, "status": "failed", "error": msg, "traceback": traceback.format_exc(limit=8)}
    t1 = time.perf_counter()
    data = summary.to_dict() | {"run": str(final)}
    (partial / SUMMARY_FILE).write_text(json.dumps(data, indent=1, default=str))
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, final)
    timing = {"replay_s": round(t1 - t0, 3), "record_s": summary.wall_s,
              "write_s": round(time.perf_counter() - t1, 3)}
    return {"run": spec.key, "status": "ok", "timing": timing}


def sweep_env(root: str | Path) -> dict:
    """The sweep-wide ``--env`` of the sweep at ``root`` (its ``sweep.json``)."""
    try:
        return dict(json.loads((Path(root) / SWEEP_FILE).read_text()).get("env") or {})
    except (OSError, ValueError):
        return {}


def sweep_model(root: str | Path) -> str | None:
    """The sweep-wide ``--model`` of the sweep at ``root`` (its ``sweep.json``; None: the trace's bytes)."""
    try:
        return json.loads((Path(root) / SWEEP_FILE).read_text()).get("model")
    except (OSError, ValueError):
        return None


def job_result(spec: RunSpec, job: Path, returncode: int) -> dict:
    """The result a run's process left next to its job file, or a failure naming its exit and log."""
    out = job.with_suffix("").with_suffix(".result.json")
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError):
        log = job.with_suffix("").with_suffix(".log")
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.is_file() else []
        return {"run": spec.key, "status": "failed",
                "error": f"worker exited with status {returncode}" + (f": {' | '.join(tail)}" if tail else "")}


__all__ = ["ENV_PREFIX", "PARTIAL_DIR", "SWEEP_FILE", "RunSpec", "job_result", "run_one", "sweep_env", "sweep_model"]
