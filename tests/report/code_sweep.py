"""A code-axis sweep laid out from the bundled runs, without starting any code's process.

The layout is the one ``kvtrace sweep --code`` writes (``replay/runs/sweep.py``):
``R/code=<name>/policy=<p>/<grid k>=<v>/`` run directories (a trace plus ``summary.json``), the
manifest's ``run.code`` and ``run.env``, the summary's ``code``/``policy``/``env``,
``R/sweep.json`` with the codes in ``--code`` order and ``R/summary.parquet`` with one row per run
(a code that could not be prepared: ``status=failed``, its error). Each run's files are a copy of a
bundled 0.5.23 run (``data/traces/ab/baseline`` or ``swa-fixes``), so its figures are known.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from replay.paths import bundled

TARBALLS = {"pre": "../shared/targets/bytedance-dsv4/sglang-pre659.tar.xz",
            "post": "../shared/targets/bytedance-dsv4/sglang-post659.tar.xz"}
#: the fork commits' known fingerprints (tracer/sglang/targets) and the installed 0.5.23's
CODES = {"pre": {"spec": TARBALLS["pre"], "sha": "b0d0a53c805b0f4e", "target": "bytedance-dsv4-pre659",
                 "fingerprint": "08b6f0e5c092f0d9"},
         "post": {"spec": TARBALLS["post"], "sha": "66634ecf03c492ca", "target": "bytedance-dsv4-post659",
                  "fingerprint": "58394317f0758d21"},
         "base": {"spec": "installed", "sha": "", "target": "sglang-0.5.23", "fingerprint": "e1a90e7ecd1b0247"}}
ENV_KEY = "env.SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER"


def code_of(name: str) -> dict:
    c = CODES[name]
    return {"name": name, **c, "fingerprint_known": True, "reason": f"{c['target']}: known source fingerprint"}


def write_code_sweep(root: Path, runs: dict[str, str], *, codes: list[str], failed: dict[str, str] | None = None,
                     grid: dict | None = None) -> Path:
    """``runs``: {relative run dir: bundled run (``baseline`` | ``swa-fixes``)}; ``codes`` in
    ``--code`` order; ``failed``: {code: error} of codes without a run."""
    import polars as pl

    rows = []
    for rel, src in runs.items():
        parts = dict(p.split("=", 1) for p in Path(rel).parts)
        code, policy = parts.pop("code"), parts.pop("policy")
        env = {k[len("env."):]: v for k, v in parts.items() if k.startswith("env.")}
        d = root / rel
        shutil.copytree(bundled(f"traces/ab/{src}"), d)
        m = json.loads((d / "manifest.json").read_text())
        m["run"] |= {"policy": policy, "code": code_of(code), "env": env,
                     "backend": "sglang" if code == "base" else "fork"}
        if code != "base":
            m["env"] = dict(m.get("env") or {}) | env  # what the code's process ran with
        (d / "manifest.json").write_text(json.dumps(m, indent=1))
        s = json.loads((d / "summary.json").read_text())
        s |= {"policy": policy, "code": code_of(code), "env": env, "run": str(d)}
        (d / "summary.json").write_text(json.dumps(s, indent=1))
        rows.append({"run": rel, "code": code, "policy": policy, **parts, "status": "ok", "error": ""})
    for code, error in (failed or {}).items():
        rows.append({"run": f"code={code}/policy=recorded", "code": code, "policy": "recorded", "status": "failed",
                     "error": error})
    specs = {c: CODES[c]["spec"] if c in CODES else f"/nowhere/{c}.tar.xz" for c in codes}
    (root / "sweep.json").write_text(json.dumps({"source": "data/workloads/multi_turn", "backend": "sglang",
                                                 "grid": grid or {}, "sets": [], "codes": specs, "env": {},
                                                 "policies": sorted({r["policy"] for r in rows})}, indent=1))
    pl.DataFrame(rows, infer_schema_length=None).write_parquet(root / "summary.parquet")
    return root


def grid_sweep(root: Path) -> Path:
    """pre and post (``--code pre=...,post=...,bad=...``) x ``recorded`` x two env points; at
    point 1 pre is the baseline run and post the swa-fixes run, at point 2 the other way round."""
    e = ENV_KEY
    return write_code_sweep(root, {
        f"code=pre/policy=recorded/{e}=1": "baseline", f"code=pre/policy=recorded/{e}=2": "swa-fixes",
        f"code=post/policy=recorded/{e}=1": "swa-fixes", f"code=post/policy=recorded/{e}=2": "baseline",
    }, codes=["pre", "post", "bad"], failed={"bad": "code bad: cannot prepare /nowhere/bad.tar.xz: no such file"},
        grid={e: ["1", "2"]})


def policy_sweep(root: Path) -> Path:
    """``--code base=installed --policies baseline,swa-fixes`` resumed with ``--code post=...``
    (policy ``recorded``) into the same directory: code x policy with holes."""
    return write_code_sweep(root, {"code=base/policy=baseline": "baseline", "code=base/policy=swa-fixes": "swa-fixes",
                                   "code=post/policy=recorded": "swa-fixes"}, codes=["base", "post"])
