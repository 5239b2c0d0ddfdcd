"""Runs on a *code*: ``replay_run(..., code=SPEC)``, ``kvtrace replay/sweep/record --code SPEC``,
``kvtrace doctor --replay --code SPEC``.

A code is an sglang source tree: a tarball like those in ``../shared/targets/``, a directory
holding ``python/sglang`` or ``sglang/``, or a PyPI release ``sglang==X`` (its wheel;
:func:`replay.codes.prepare`: unpacked once, cached by content, light pins in an overlay), or
``installed`` (the venv's sglang 0.5.23, run in-process: the default). ``sglang==X`` is the
installed sglang when X is its version.

:func:`one_code` resolves the one code of a run; :func:`record_on_code` is the one call into a
code's process, shared by :func:`replay_code` (``replay``, ``sweep``) and :func:`record_code`
(``record``, and ``doctor --replay``, which records through ``replay.record.record_workload``).

A code that is not ``installed`` runs in its own process (:func:`replay.codes.call_in_code`), on
the replay backend of its target, recognized from its code (``tracer.sglang.targets.detect``,
never the version string): the fork's commits (``bytedance-dsv4-*``) on
:mod:`replay.backends.fork.backend`, an upstream release (``sglang-*``, e.g. ``sglang==0.5.22``
recognized as ``sglang-0.5.23`` by names and signatures) on the real-code backend in that
release's process (:mod:`replay.backends.sglang.code_run`, :data:`CODE_ENTRIES`). A code whose
target is unknown is refused naming what failed.

No behaviour patch reaches a code: a commit is its own behaviour. So a code run takes the preset
``recorded`` only, and the policy knobs (:data:`POLICY_KNOBS`) are the code's own; setting one
(``--set``/``--grid``) is refused naming the knob (``--env`` sets the code's own switches, e.g.
``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS=1``). Sizes and the virtual clock's knobs reach
the code as server arguments (:func:`replay.backends.fork.backend.server_kwargs`).

Environment of the code's process: the ``SGLANG_*`` switches the source's manifest recorded
(``env`` block: what the server ran with), then ``--env K=V`` (per run or per grid point).

The run's manifest has ``run.code`` = ``{name, spec, sha, target, fingerprint, fingerprint_known,
reason}`` and ``run.env``; its ``summary.json`` has ``code`` too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from replay import knobs
from replay.runs.summary import SUMMARY_FILE, RunError, RunSummary, _summarize, write_json_atomic

INSTALLED = "installed"
#: knobs that are behaviour (a commit's own): refused on a code run when set
POLICY_KNOBS = ("swa_lru_refresh", "swa_admission", "host_free", "swa_out_of_window_release",
                "swa_release_boundary", "prefix_ownership", "device_free")
#: a code's backend -> the entry point its process calls (JSON contract of
#: ``replay.backends.fork.backend.record``)
CODE_ENTRIES = {"fork": "replay.backends.fork.backend:record",
                "sglang": "replay.backends.sglang.code_run:record"}
#: knobs the fork's backend cannot express when set: knob -> why
FORK_REFUSED = {"tree_core": "the fork's tree is pure Python (no Rust core)",
                "scheduler": "the fork backend drives the fork's own Scheduler",
                "decode_coalescing": "the fork backend steps the fork's own loop (coalescing is the reference "
                                     "backend's)",
                "stop_on_retraction": "the fork backend runs every request (stopping early is the reference "
                                      "backend's)",
                "swa_eviction_interval_tokens": "the fork's decode release cadence is the window times "
                                                "SGLANG_SWA_EVICTION_INTERVAL_MULTIPLIER (use --env)"}
#: a policy knob's value a code has its own switch for: (knob, value) -> (SGLANG_* name, value); used
#: where a recommendation names the knob (``doctor --replay --code``) and the code defines the switch
CODE_SWITCHES = {("swa_out_of_window_release", "decode_and_unfinished_insert"):
                 ("SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS", "1")}
#: the knobs whose values reach the code (recorded in the run's settings)
CODE_KNOBS = tuple(k.name for k in knobs.KNOBS if k.name not in POLICY_KNOBS + tuple(FORK_REFUSED))


@dataclass(frozen=True)
class Code:
    """A code resolved for a run: where it is, its content key and its recognized target."""

    name: str
    spec: str
    sha: str = ""
    target: str = ""
    fingerprint: str = ""
    fingerprint_known: bool = False
    reason: str = ""
    env: object = None  # replay.codes.CodeEnv, None for the installed code

    @property
    def installed(self) -> bool:
        return self.env is None

    @property
    def backend(self) -> str:
        """The backend that runs it in its process: ``fork`` (the DeepSeek-V4 fork's commits) or
        ``sglang`` (an upstream release: the real-code backend against that release's classes)."""
        return "fork" if self.target.startswith("bytedance-dsv4") else "sglang"

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("env")
        d["python_dir"] = str(self.env.python_dir) if self.env is not None else ""
        return d


def default_name(spec: str) -> str:
    """A code's name from its spec: ``.../sglang-post659.tar.xz`` -> ``post659``."""
    if spec in (INSTALLED, "") or spec.startswith("sglang=="):
        return INSTALLED if spec in (INSTALLED, "") else spec.replace("==", "-")
    base = Path(spec.rstrip("/")).name
    for suf in (".tar.xz", ".tar.gz", ".tgz", ".tar.bz2", ".tar"):
        if base.endswith(suf):
            base = base[: -len(suf)]
    return re.sub(r"^sglang-", "", base) or "code"


def parse_codes(items) -> dict[str, str]:
    """``name=SPEC,name=SPEC`` (or a bare ``SPEC``) strings -> {name: spec}, in order.

    Raises:
        RunError: an empty or duplicate name, or a name that is not a plain word.
    """
    out: dict[str, str] = {}
    for item in [items] if isinstance(items, str) else list(items):
        for part in [p.strip() for p in str(item).split(",") if p.strip()]:
            name, sep, spec = part.partition("=")
            if not sep or name.startswith("sglang") and spec.startswith("="):
                name, spec = default_name(part), part
            name, spec = name.strip(), spec.strip()
            if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
                raise RunError(f"--code {part!r}: the name {name!r} must be letters, digits, '_', '.', '+' or '-'")
            if name in out:
                raise RunError(f"--code: the name {name!r} is given twice")
            out[name] = spec
    return out


def parse_env(items) -> dict[str, str]:
    """``K=V`` strings (``--env``) -> dict. Raises RunError on a malformed item."""
    if isinstance(items, dict):
        return {str(k): str(v) for k, v in items.items()}
    out = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise RunError(f"--env {item!r}: expected NAME=VALUE")
        out[key.strip()] = value
    return out


def resolve_code(spec: str, name: str | None = None) -> Code:
    """Prepare ``spec`` and recognize its target (files only; nothing is imported here).

    Raises:
        RunError: the spec cannot be prepared, its target is unknown, or no backend runs it.
    """
    from replay.backends.fork.backend import detect_target as detect
    from replay.codes import CodePrepareError, prepare

    name = name or default_name(spec)
    m = re.fullmatch(r"sglang==(\S+)", spec)
    installed = detect() if spec in (INSTALLED, "") or m else None
    if installed is not None and (not m or m.group(1) == (installed.sglang_version or "")):
        det = installed
        if det.target is None:
            raise RunError(f"code {name} ({spec}): the installed sglang is no known target: {det.reason}")
        return Code(name, spec, "", det.target_name, det.fingerprint or "", det.fingerprint_known, det.reason)
    try:
        env = prepare(spec)
    except CodePrepareError as e:
        raise RunError(f"code {name}: cannot prepare {e}") from None
    det = detect(env.python_dir / "sglang")
    if det.target is None:
        raise RunError(f"code {name} ({spec}): {det.reason}")
    return Code(name, spec, env.sha, det.target_name, det.fingerprint or "", det.fingerprint_known, det.reason,
                env)


def one_code(code: str | Code | None, env=()) -> Code | None:
    """The one code of a run (``SPEC`` or ``NAME=SPEC``; ``replay``, ``record``, ``doctor --replay``),
    resolved; None without ``--code`` (the installed sglang, in this process, as ``installed`` is:
    check :attr:`Code.installed`).

    Raises:
        RunError: several codes, a spec that cannot be prepared or matched (:func:`resolve_code`),
            or ``env`` without a code of its own process.
    """
    resolved = code
    if code is not None and not isinstance(code, Code):
        named = parse_codes(str(code))
        if len(named) != 1:
            raise RunError(f"--code {code!r}: one code per run (a sweep takes several: kvtrace sweep --code ...)")
        ((name, spec),) = named.items()
        resolved = resolve_code(spec, name)
    if parse_env(env) and (resolved is None or resolved.installed):
        raise RunError("--env applies to a code's own process; the installed sglang runs in this process "
                       "(its switches come from the policy knobs): give --code SPEC")
    return resolved


def check_code_sets(overrides: dict) -> None:
    """Refuse knobs a code run cannot take: a policy knob (a commit is its own behaviour) or one
    the fork backend cannot express (:data:`FORK_REFUSED`), naming the knob."""
    for name in overrides:
        if name in POLICY_KNOBS:
            raise RunError(f"{name} cannot be set on a code: a commit is its own behaviour (no patch); "
                           "compare codes, or set the code's own switch with --env (e.g. "
                           "SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS=1)")
        if name in FORK_REFUSED:
            raise RunError(f"{name} cannot be expressed by the fork backend: {FORK_REFUSED[name]}")


def code_switch(code: Code, knob: str, value) -> tuple[str, str] | None:
    """The code's own switch for ``knob=value`` (:data:`CODE_SWITCHES`) when the code defines it
    (its ``sglang/srt/environ.py`` names it; files only), else None."""
    switch = CODE_SWITCHES.get((knob, str(value)))
    if switch is None or code.env is None:
        return None
    environ = Path(code.env.python_dir) / "sglang" / "srt" / "environ.py"
    try:
        return switch if switch[0] in environ.read_text(errors="replace") else None
    except OSError:
        return None


def code_settings(source: str | Path, policy: str, sets=(), *, base: dict | None = None) -> tuple[dict, list[str]]:
    """Knob values of a code run: ``recorded`` sizes with ``sets`` over them (see module doc).

    Args:
        base: the knob values under ``sets``; None: what ``source``'s manifest records (``replay``;
            ``record`` gives ``{}``: the knob defaults, as on the installed sglang).
    Raises:
        RunError: another preset than ``recorded``, a policy knob or a knob the fork cannot express set.
    """
    from tracer.schema.manifest import read_manifest

    if policy != "recorded":
        raise RunError(f"policy {policy!r} on a code: a commit is its own behaviour, so a code run takes "
                       "policy 'recorded' only (its sizes from --set/--grid, its switches from --env)")
    try:
        overrides = dict(sets) if isinstance(sets, dict) else knobs.parse_sets(sets)
    except knobs.KnobError as e:
        raise RunError(str(e)) from None
    check_code_sets(overrides)
    try:
        manifest = read_manifest(Path(source))
        from replay.backends.dsv4 import recorded_settings  # DSV4 captures: their stack's facts

        recorded = recorded_settings(source, manifest) if base is None else dict(base)
        values, assumed = knobs.resolve("recorded", overrides, recorded)
    except knobs.KnobError as e:
        raise RunError(str(e)) from None
    except Exception as e:
        raise RunError(f"{source}: cannot read its manifest.json ({e}); expected a trace or workload directory") from None
    kind = os.environ.get("KVTRACE_FORK_MODEL") or ("dsv4" if values.get("kv_stack") == "dsv4" else "")
    if kind == "dsv4" and "page_size" in overrides and overrides["page_size"] != 256:
        raise RunError(f"page_size={overrides['page_size']} on a DeepSeek-V4 code: the fork forces page 256")
    return values, [a for a in assumed if a not in POLICY_KNOBS]


def recorded_env(source: str | Path) -> dict[str, str]:
    """The ``SGLANG_*`` switches the source's manifest recorded (what the server ran with)."""
    from tracer.schema.manifest import read_manifest

    try:
        env = read_manifest(Path(source)).get("env") or {}
    except Exception:
        return {}
    return {str(k): str(v) for k, v in env.items() if str(k).startswith("SGLANG_")}


def replay_code(source: str | Path, out: str | Path, code: Code | str, *, policy: str = "recorded", sets=(),
                env=(), detail: str = "counts", progress: bool = False, timeout_s: float | None = None) -> RunSummary:
    """Replay ``source`` on ``code`` (not the installed one) into the run ``out``.

    Raises:
        RunError: bad spec, policy, knob, source or output directory; the code's process failed
            (the message names the code and the error; its stderr tail is in ``out/code.log``).
    """
    source, out = Path(source), Path(out)
    code = code if isinstance(code, Code) else resolve_code(code)
    values, assumed = code_settings(source, policy, sets)
    if out.exists() and (not out.is_dir() or any(p.name != "sglang.log" for p in out.iterdir())):
        raise RunError(f"{out}: exists and is not an empty directory; choose a new --out")
    proc_env = recorded_env(source) | parse_env(env)
    run_block = {"policy": policy, "backend": code.backend, "source": str(source), "settings": reaching_settings(values),
                 "assumed": assumed, "code": code.as_dict(), "env": proc_env,
                 "policy_knobs": "the code's own (no patch)"}
    rec, data = record_on_code(code, source, out, values, run_block, env=proc_env, detail=detail,
                               progress=progress, timeout_s=timeout_s)
    summary = _summarize(out, rec, run_block)
    summary = RunSummary.from_dict(summary.to_dict() | {"code": code.as_dict() | {"kind": data["kind"],
                                                                                 "pools": data["pools"]},
                                                         "env": proc_env})
    write_json_atomic(out / SUMMARY_FILE, summary.to_dict())
    return summary


def record_code(workload: str | Path, out: str | Path, code: Code, *, overrides=(), env=(), detail: str = "counts",
                progress: bool = False, timeout_s: float | None = None) -> dict:
    """``kvtrace record --code``: record ``workload`` on ``code`` into the trace ``out``.

    Settings as on the installed sglang: the knob defaults with ``overrides`` over them (a policy
    knob refused, see :func:`code_settings`); environment: the workload's recorded ``SGLANG_*``
    switches, then ``env``. The manifest's ``run`` block says ``command: record`` with the code,
    the env and the settings that reached the code.

    Returns:
        the ``backend.json`` object (the caller writes it): ``backend: fork``, ``settings``,
        ``code`` (with the model ``kind`` and the ``pools`` built), ``env``, ``result``, ...
    Raises:
        RunError: a knob a code cannot take, or the code's process failed (see :func:`record_on_code`).
    """
    import dataclasses

    values, _ = code_settings(workload, "recorded", overrides, base={})
    proc_env = recorded_env(workload) | parse_env(env)
    reaching = reaching_settings(values)
    run_block = {"command": "record", "backend": code.backend, "source": str(workload), "settings": reaching,
                 "code": code.as_dict(), "env": proc_env, "policy_knobs": "the code's own (no patch)"}
    rec, data = record_on_code(code, workload, out, values, run_block, env=proc_env, detail=detail,
                               progress=progress, timeout_s=timeout_s)
    return {"trace": str(out), "workload": str(workload), "backend": code.backend, "sglang_version": code.target,
            "settings": reaching, "patches": [], "code": code.as_dict() | {"kind": data["kind"], "pools": data["pools"]},
            "env": proc_env, "coverage": data.get("coverage"), "hook_failures": rec.hook_failures,
            "result": dataclasses.asdict(rec.result), "end_state": "complete"}


def reaching_settings(values: dict) -> dict:
    """The knob values that reach a code (:data:`CODE_KNOBS`; the run's recorded settings)."""
    return {k: values[k] for k in CODE_KNOBS if k in values}


def record_on_code(code: Code, source: str | Path, out: str | Path, values: dict, run_block: dict, *,
                   env: dict, detail: str = "counts", progress: bool = False, timeout_s: float | None = None):
    """Record ``source``'s requests on ``code`` into the trace ``out``, in the code's own process
    (``replay.backends.fork.backend:record``), with ``run_block`` as the manifest's ``run`` and
    ``env`` over this process's environment. The one code-process call of ``replay``, ``sweep``,
    ``record`` and ``doctor --replay``.

    Returns:
        (:class:`replay.backends.base.RecordedRun`, the process's JSON result: ``kind``, ``pools``,
        ``target``, ``coverage``, ...).
    Raises:
        RunError: the code's process failed (the message names the code and the error; its
            traceback and stderr tail are in ``out/code.log``) or ran another target.
    """
    from replay.backends.base import RecordedRun, RequestTimes, RunResult
    from replay.codes import CodeCallError, call_in_code

    source, out = Path(source), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prog_path = Path(tempfile.mkdtemp(prefix="kvtrace-code-progress-")) / "progress.json"
    kwargs = {"source": str(source.resolve()), "out": str(out.resolve()), "settings": values, "detail": detail,
              "manifest_extra": {"run": run_block}, "progress_file": str(prog_path)}
    box: dict = {}

    def call() -> None:
        try:
            box["run"] = call_in_code(code.env, CODE_ENTRIES[code.backend], kwargs, env=env,
                                      timeout_s=timeout_s)
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e

    worker = threading.Thread(target=call, name="kvtrace-code-run", daemon=True)
    worker.start()
    bar = _bar(code.name) if progress else None
    try:
        while worker.is_alive():
            worker.join(0.5)
            if bar is not None:
                _draw(bar, prog_path)
    finally:
        if bar is not None:
            bar.close()
        shutil.rmtree(prog_path.parent, ignore_errors=True)
    err = box.get("error")
    if err is not None:
        if isinstance(err, CodeCallError):
            (out / "code.log").write_text((err.traceback or "") + "\n" + (err.stderr or "")[-20000:])
            raise RunError(f"code {code.name} ({code.spec}, {code.target}): {err.args[0].split(': ', 1)[-1]} "
                           f"(details: {out / 'code.log'})") from None
        raise RunError(f"code {code.name} ({code.spec}): {type(err).__name__}: {err}") from None
    data = box["run"].result
    if data.get("target", {}).get("target") != code.target:
        raise RunError(f"code {code.name}: its process ran {data.get('target')}, expected {code.target}")
    rec = RecordedRun(result=RunResult(**data["result"]),
                      times={int(k): RequestTimes(**v) for k, v in data["times"].items()},
                      sched_cpu_ns=int(data["sched_cpu_ns"]), wall_ns=int(data["wall_ns"]),
                      first_arrival_ns=int(data["first_arrival_ns"]), hook_failures=data["hook_failures"])
    return rec, data


def _bar(name: str):
    from tqdm import tqdm

    from replay.console import progress_stream

    return tqdm(total=None, unit="req", desc=f"replay {name}", leave=False, mininterval=0.5, disable=None,
                file=progress_stream())


def _draw(bar, path: Path) -> None:
    try:
        done, total, _ = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if bar.total != total:
        bar.total = total
    bar.update(done - bar.n)


__all__ = ["CODE_KNOBS", "CODE_SWITCHES", "Code", "FORK_REFUSED", "INSTALLED", "POLICY_KNOBS", "check_code_sets", "code_settings", "code_switch",
           "default_name", "one_code", "parse_codes", "parse_env", "reaching_settings", "record_code", "record_on_code",
           "recorded_env", "replay_code", "resolve_code"]
