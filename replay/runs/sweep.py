"""``sweep``: the cross product of policies and a grid of knob values, each run in its own process.

Layout (hive-style, so DuckDB/Polars read the tree with partition columns)::

    RUNS/policy=<p>/<k1>=<v1>/<k2>=<v2>/   one run each (a trace plus summary.json)
    RUNS/summary.parquet                  one row per run: policy, grid values, figures, status
    RUNS/sweep.json                       the sweep's source, policies, grid, backend

Each run writes into ``RUNS/.partial/<id>/`` and is renamed into place when it completes, so a
run directory exists only when complete. Re-running the same sweep skips completed runs and
redoes interrupted ones (their partial directories are ours to remove). A failed run is reported
in ``summary.parquet`` (``status=failed`` and the error) and does not stop the others; its partial
directory stays for inspection until the sweep is run again.

Every run is its own process (patches are per process), at most ``--jobs`` at a time, its output
in ``RUNS/.partial/<run>.log`` (``--executor local``, :mod:`replay.runs.pool`: children forked by
one warm zygote that imported sglang once, or a cold ``python -m replay.runs.worker`` per run
where the zygote is not available), or Ray tasks with ``max_calls=1`` (``--executor ray``, a cluster address
from ``RAY_ADDRESS`` or a local Ray). An interrupted sweep (SIGINT, SIGTERM) stops its children,
writes ``summary.parquet`` with the unfinished runs as ``interrupted`` and can be resumed.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import shutil
from pathlib import Path

from replay import knobs
from replay.runs.jobs import ENV_PREFIX, PARTIAL_DIR, SWEEP_FILE, RunSpec, _fmt, job_result, run_one, sweep_env
from replay.runs.replay import SUMMARY_FILE, RunError, read_summary, resolve_settings

_run_one, _job_result, _sweep_env = run_one, job_result, sweep_env  # (names used before jobs.py)

EXECUTORS = ("local", "ray")


def parse_grid(items) -> list[tuple[str, list[object]]]:
    """``k=v1,v2`` strings -> [(knob, [values])], each value checked against the knob table;
    ``env.NAME=v1,v2`` (NAME an ``SGLANG_*``/``KVTRACE_*`` switch) -> [("env.NAME", [strings])]."""
    grid: list[tuple[str, list[object]]] = []
    for item in items:
        key, sep, raw = str(item).partition("=")
        key = key.strip()
        if not sep or not raw:
            raise RunError(f"--grid {item!r}: expected knob=v1,v2,...")
        if key.startswith(ENV_PREFIX):
            if any(key == g for g, _ in grid):
                raise RunError(f"--grid {key} given twice")
            grid.append((key, _env_values(key, raw)))
            continue
        key = key.replace("-", "_")
        try:
            k = knobs.knob(key)
            values = [k.parse(v) for v in raw.split(",") if v.strip()]
        except knobs.KnobError as e:
            raise RunError(str(e)) from None
        if any(key == g for g, _ in grid):
            raise RunError(f"--grid {key} given twice")
        grid.append((key, values))
    return grid


def _env_values(key: str, raw: str) -> list[str]:
    """The values of a grid key ``env.NAME`` (each one a hive level ``env.NAME=<v>``).

    Raises:
        RunError: NAME is not an ``SGLANG_*``/``KVTRACE_*`` switch, no value, a value given twice
            or one that cannot name a directory.
    """
    name = key[len(ENV_PREFIX):]
    if not re.fullmatch(r"(SGLANG|KVTRACE)_[A-Za-z0-9_]+", name):
        raise RunError(f"--grid {key}: env.NAME sets a switch of the code's process, and NAME must be an SGLANG_* "
                       f"or KVTRACE_* variable (letters, digits, '_'), e.g. "
                       f"--grid env.SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER=1,2; got {name!r}")
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not values:
        raise RunError(f"--grid {key}={raw}: expected {key}=v1,v2,...")
    for v in values:
        if not re.fullmatch(r"[A-Za-z0-9_.+:-]+", v) or v in (".", ".."):
            raise RunError(f"--grid {key}={raw}: the value {v!r} cannot name the run's directory "
                           f"({key}={v}); use letters, digits, '_', '.', '+', ':' or '-'")
    dup = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if dup is not None:
        raise RunError(f"--grid {key}={raw}: the value {dup!r} is given twice")
    return values


def plan(policies, grid, codes: dict[str, str] | None = None) -> list[RunSpec]:
    """The cross product of codes (``{name: spec}``; none: the installed sglang), ``policies`` and
    the grid, in a stable order."""
    names = [g for g, _ in grid]
    combos = itertools.product(*[vals for _, vals in grid]) if grid else [()]
    combos = list(combos)
    code_items = list((codes or {"": ""}).items())
    return [RunSpec(p, tuple(zip(names, c)), name, spec) for name, spec in code_items for p in policies
            for c in combos]


def _check_codes(source: Path, specs: list[RunSpec], sets, backend: str) -> dict[str, str]:
    """Prepare every code once (children then find it cached) and check each run's settings.

    Returns:
        {code name: why it cannot run} for the codes that cannot be prepared or matched (their
        runs are reported failed; the other codes go on).
    Raises:
        RunError: a setting no run of a code can take (refused before any process starts).
    """
    from replay.runs.code import code_settings, resolve_code

    bad: dict[str, str] = {}
    resolved: dict = {}
    for spec in specs:
        if spec.code and spec.code not in resolved and spec.code not in bad:
            try:
                resolved[spec.code] = resolve_code(spec.code_spec, spec.code)
            except RunError as e:
                bad[spec.code] = str(e)
        if spec.code in bad:
            continue
        overrides = dict(knobs.parse_sets(sets)) | spec.knob_grid
        if spec.code and not resolved[spec.code].installed:
            code_settings(source, spec.policy, overrides)
        else:
            if spec.env_grid:
                raise RunError(f"--grid env.*: environment switches apply to a code's own process; "
                               f"{spec.code or 'the installed sglang'} runs in this process")
            resolve_settings(source, spec.policy, overrides, backend)
    return bad


def sweep(source: str | Path, out: str | Path, *, policies, grid=(), sets=(), jobs: int = 1,
          executor: str = "local", backend: str = "sglang", detail: str = "counts",
          progress: bool = False, codes=None, env=(), model: str | None = None, points=None, stop=None):
    """Run every (policy, grid point) over ``source`` into ``out``; returns the summary table.

    Args:
        source: trace or workload directory.
        out: sweep directory (created; an existing sweep of the same source is resumed).
        policies: preset names.
        grid: ``k=v1,v2`` strings or ``[(knob, [values])]``.
        sets: ``key=value`` overrides applied to every run (before the grid values).
        jobs: runs at a time.
        executor: ``local`` (process pool) or ``ray``.
        backend: replay backend.
        detail: recorder detail of each run.
        progress: a bar over runs on stderr.
        codes: ``{name: spec}`` or ``name=SPEC,...`` strings (``replay.runs.code``): a ``code=<name>``
            level above ``policy=``; each run on its code's own process. A code that cannot be
            prepared or matched has its runs reported failed; the other codes go on.
        env: ``K=V`` strings or a dict for every code's process (grid keys ``env.NAME`` per point).
        model: a model preset (``replay.models``) for every run's GB figures (kept in ``sweep.json``;
            a resumed sweep must give the same).
        points: instead of ``grid``'s cross product, these grid points (``[{knob: value}]``, all
            with the same knobs in the same order; e.g. full/SWA pool pairs at one memory budget,
            ``replay.runs.plan``). A resumed sweep may add points.
        stop: ``(results) -> str``, called with ``{run key: result}`` (every completed run, those
            of earlier sessions too) whenever a run ends: a non-empty reason ends the sweep there;
            the runs still going are killed and, with those not started, reported ``skipped`` with
            that reason (a later sweep runs them). ``replay.runs.plan`` stops its search this way.
    Returns:
        polars DataFrame of ``out/summary.parquet`` (one row per run).
    Raises:
        RunError: bad policy, knob, value, backend or executor; ``out`` holds a different sweep.
    """
    source, out = Path(source), Path(out)
    if executor not in EXECUTORS:
        raise RunError(f"unknown executor {executor!r}; known: {', '.join(EXECUTORS)}")
    if jobs < 1:
        raise RunError(f"--jobs {jobs}: expected a positive number")
    policies = [p.strip() for p in policies if p.strip()]
    if not policies:
        raise RunError("no policies given; e.g. --policies baseline,swa-fixes (see kvtrace policies)")
    grid = grid if grid and isinstance(grid[0], tuple) and isinstance(grid[0][1], list) else parse_grid(grid)
    if points is not None:
        if grid:
            raise RunError("give grid points or a grid, not both")
        points = _check_points(points)
    from replay.runs.code import parse_codes, parse_env

    codes = parse_codes(codes) if codes and not isinstance(codes, dict) else dict(codes or {})
    env = parse_env(env)
    if env and not codes:
        raise RunError("--env applies to a code's own process; give --code name=SPEC,...")
    specs = plan(policies, grid, codes) if points is None else \
        [RunSpec(p, tuple(pt.items()), name, spec) for name, spec in (codes or {"": ""}).items()
         for p in policies for pt in points]
    if points is not None:
        grid = [(k, list(dict.fromkeys(pt[k] for pt in points))) for k in points[0]] if points else []
    # fail fast on a bad combination before any process starts; a code that cannot be prepared
    # or matched only fails its own runs
    bad_codes = _check_codes(source, specs, sets, backend)
    if model is not None:
        from replay.models import ModelError, preset

        try:
            preset(model)
        except ModelError as e:
            raise RunError(str(e)) from None
    _claim(out, source, policies, grid, sets, backend, codes, env, model)
    todo = [s for s in specs if not (out / s.rel_dir / SUMMARY_FILE).is_file() and s.code not in bad_codes]
    shutil.rmtree(out / PARTIAL_DIR, ignore_errors=True)
    results = {s.key: {"run": s.key, "status": "ok"} for s in specs
               if s not in todo and s.code not in bad_codes}
    results |= {s.key: {"run": s.key, "status": "failed", "error": bad_codes[s.code]} for s in specs
                if s.code in bad_codes}
    args = [(str(source), str(out), s, tuple(sets), backend, detail) for s in todo]
    runner = (functools.partial(_run_local, warm=_warm_spec(source, todo, sets, backend, jobs))
              if executor == "local" else _run_ray)
    bar = _bar(len(specs), len(specs) - len(todo)) if progress else None
    why = stop(results) if stop is not None and results else ""
    try:
        runs = runner(args, jobs) if not why else iter(())
        for res in runs:
            results[res["run"]] = res
            if bar:
                bar.update(1)
            why = stop(results) if stop is not None else ""
            if why:
                runs.close()  # kills the runs still going
                break
        if why:
            for s in specs:
                results.setdefault(s.key, {"run": s.key, "status": "skipped", "error": why})
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM through signals_as_interrupts
        from replay.errors import Interrupted, signal_of

        for s in specs:  # a run may have completed after the last result was collected
            complete = (out / s.rel_dir / SUMMARY_FILE).is_file()
            results.setdefault(s.key, {"run": s.key, "status": "ok" if complete else "interrupted",
                                       "error": "" if complete else "sweep interrupted"})
        _write_table(out, specs, results, grid)
        sig = signal_of(e)
        done = sum(r["status"] == "ok" for r in results.values())
        raise Interrupted(sig, f"{out}: sweep interrupted by {sig} with {done} of {len(specs)} runs complete; "
                               "run the same command again to resume") from None
    finally:
        if bar:
            bar.close()
    return _write_table(out, specs, results, grid)


def _check_points(points) -> list[dict]:
    """Explicit grid points: each a ``{knob: value}`` with the same knobs, values checked."""
    out = []
    for pt in points:
        try:
            out.append({k: knobs.knob(k).parse(str(v)) for k, v in dict(pt).items()})
        except knobs.KnobError as e:
            raise RunError(str(e)) from None
    if out and any(list(pt) != list(out[0]) for pt in out):
        raise RunError("grid points must all set the same knobs, in the same order")
    return out


def _claim(out: Path, source: Path, policies, grid, sets, backend: str, codes=None, env=None,
           model: str | None = None) -> None:
    meta = {"source": str(source), "backend": backend, "grid": {k: [_fmt(v) for v in vs] for k, vs in grid},
            "sets": list(sets)}
    if model is not None:
        meta["model"] = model
    if codes:
        meta |= {"codes": dict(codes), "env": dict(env or {})}
    path = out / SWEEP_FILE
    if path.is_file():
        old = json.loads(path.read_text())
        if old.get("source") != meta["source"] or old.get("backend") != backend:
            raise RunError(f"{out} holds a sweep of {old.get('source')} ({old.get('backend')}); "
                           f"choose a new --out for {source} ({backend})")
        if old.get("model") != model:
            raise RunError(f"{out}: this sweep ran with --model {old.get('model')}, now {model}; "
                           "choose a new --out")
        meta["policies"] = list(dict.fromkeys(list(old.get("policies", [])) + list(policies)))
        for k, vs in (old.get("grid") or {}).items():  # a resumed sweep keeps the values it ran
            meta["grid"][k] = list(dict.fromkeys(list(vs) + meta["grid"].get(k, [])))
        for name, spec in (codes or {}).items():
            was = (old.get("codes") or {}).get(name)
            if was is not None and was != spec:
                raise RunError(f"{out}: code {name!r} was {was} in this sweep, now {spec}; give it another name "
                               "or choose a new --out")
        if codes or old.get("codes"):
            meta["codes"] = dict(old.get("codes") or {}) | dict(codes or {})
            if old.get("env", {}) != meta.get("env", {}):
                raise RunError(f"{out}: this sweep ran with --env {old.get('env', {})}, now {meta.get('env', {})}; "
                               "choose a new --out")
    else:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise RunError(f"{out}: exists, is not empty and holds no sweep ({SWEEP_FILE}); choose a new --out")
        meta["policies"] = list(policies)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(meta, indent=1))


def _run_local(args, jobs: int, warm: dict | None = None):
    """One process per run, at most ``jobs`` at a time (:func:`replay.runs.pool.run_local`)."""
    from replay.runs.pool import run_local

    yield from run_local(args, jobs, warm)


def _warm_spec(source: Path, todo, sets, backend: str, jobs: int) -> dict | None:
    """What the zygote keeps for the runs of a reference sweep (``replay.runs.worker.warm``): the
    source read once and its page keys at each page size the runs use, keyed by as many processes
    as the sweep runs at a time (no run starts before). None for one run (it
    would wait for what it computes itself), another backend, or a source or knob the runs will
    refuse (they report it)."""
    if backend != "reference" or len(todo) < 2 or not source.is_dir():
        return None
    sizes = set()
    try:
        for spec in todo:
            values, _ = resolve_settings(source, spec.policy, dict(knobs.parse_sets(sets)) | spec.knob_grid, backend)
            sizes.add(int(values.get("page_size") or 1))
    except Exception:  # noqa: BLE001 - the run meets the same error and reports it
        return None
    return {"source": str(source), "page_sizes": sorted(sizes), "workers": min(jobs, os.cpu_count() or 1)}


def _run_ray(args, jobs: int):
    try:
        import ray
    except ImportError:
        raise RunError("--executor ray needs Ray: pip install 'kvtrace[ray]'") from None
    from replay.runs.ray_start import start_ray

    started = start_ray(ray, jobs)  # retries a local start a loaded machine times out (see there)
    task = ray.remote(num_cpus=1, max_calls=1)(_run_one)
    pending = {}
    try:
        pending = {task.remote(*a): a[2] for a in args}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            ref = done[0]
            spec = pending.pop(ref)
            try:
                yield ray.get(ref)
            except Exception as e:
                yield {"run": spec.key, "status": "failed", "error": f"ray task failed: {type(e).__name__}: {e}"}
    finally:
        for ref in pending:  # the sweep ended early (its stop rule, an interrupt): end these too
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - already done or the cluster went away
                pass
        if started:
            ray.shutdown()


def _bar(total: int, initial: int):
    from tqdm import tqdm

    from replay.console import progress_stream

    return tqdm(total=total, initial=initial, unit="run", desc="sweep", leave=False, disable=None,
                file=progress_stream())


def _write_table(out: Path, specs, results: dict, grid):
    import polars as pl

    rows = []
    for s in specs:
        res = results.get(s.key, {"status": "failed", "error": "not run"})
        row = ({"run": s.key} | ({"code": s.code} if any(x.code for x in specs) else {})
               | {"policy": s.policy} | {k: _fmt(v) for k, v in s.grid})
        row |= {"status": res["status"], "error": res.get("error", "")}
        if res["status"] == "ok":
            summary = read_summary(out / s.rel_dir).to_dict()
            row |= {k: v for k, v in summary.items() if not isinstance(v, (dict, list))
                    and k not in ("policy", "run")}
            if summary.get("code"):
                row |= {"code_target": summary["code"].get("target", ""), "code_sha": summary["code"].get("sha", "")}
        rows.append(row)
    df = pl.DataFrame(rows, infer_schema_length=None)
    tmp = out / f".summary.parquet.tmp-{os.getpid()}"
    try:
        df.write_parquet(tmp)
        os.replace(tmp, out / "summary.parquet")
    except (OSError, pl.exceptions.ComputeError) as e:  # a full disk (polars wraps the OSError)
        from replay.errors import DataLostError

        tmp.unlink(missing_ok=True)
        raise DataLostError(f"{out / 'summary.parquet'}: could not write the sweep's table ({e}); the finished "
                            "runs are kept: free space and run the same command again to resume") from None
    return df


__all__ = ["EXECUTORS", "RunSpec", "parse_grid", "plan", "sweep"]
