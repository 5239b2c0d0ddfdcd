"""Run Python inside a prepared code's own process (its sglang first on the path).

:func:`call_in_code` calls ``module:function(**kwargs)`` there and returns its JSON result;
:func:`run_in_code` runs a module or script there and returns its exit status and output.
Both start ``<venv python> -m replay.codes.entry`` with ``PYTHONPATH`` = code dir, overlay,
this repository (then whatever the caller's ``PYTHONPATH`` held), ``KVTRACE_CODE_PYTHON`` set for
the bootstrap's check, and the caller's ``env`` entries on top (``SGLANG_*`` switches).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.codes import warm
from replay.codes.prepare import CodeEnv, prepare


class CodeCallError(RuntimeError):
    """The call inside the code's process raised (message: the error; ``.traceback``: where)."""

    def __init__(self, message: str, traceback: str = "", stderr: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback
        self.stderr = stderr


@dataclass(frozen=True)
class CodeRun:
    """One process run in a code: exit status, output, and (for a call) its result."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    result: Any = None
    bootstrap: dict | None = None


def _as_env(code: CodeEnv | str | os.PathLike) -> CodeEnv:
    return code if isinstance(code, CodeEnv) else prepare(code)


def code_environ(code: CodeEnv, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process of ``code``."""
    out = dict(os.environ)
    parts = code.pythonpath()
    if out.get("PYTHONPATH"):
        parts.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(parts)
    out["KVTRACE_CODE_PYTHON"] = str(code.python_dir)
    out.setdefault("PYTHONWARNINGS", "ignore")
    out.update(env or {})
    return out


def run_in_code(code: CodeEnv | str | os.PathLike, target: str, args: list[str] = (), *, module: bool = True,
                env: dict[str, str] | None = None, timeout_s: float | None = 600) -> CodeRun:
    """Run ``python -m target args`` (``module=True``) or ``python target args`` in ``code``.

    Raises:
        subprocess.TimeoutExpired: past ``timeout_s``.
    """
    code = _as_env(code)
    cmd = [sys.executable, "-m", "replay.codes.entry", "module" if module else "script", target, *map(str, args)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=code_environ(code, env), timeout=timeout_s)
    return CodeRun(out.returncode, out.stdout, out.stderr, round(time.perf_counter() - t0, 3))


def call_in_code(code: CodeEnv | str | os.PathLike, target: str, kwargs: dict | None = None, *,
                 env: dict[str, str] | None = None, timeout_s: float | None = 600) -> CodeRun:
    """Call ``module:function(**kwargs)`` in ``code``'s process; ``.result`` is its JSON value.

    Raises:
        CodeCallError: the function (or the bootstrap) raised there, or the process died.
        subprocess.TimeoutExpired: past ``timeout_s``.
    """
    code = _as_env(code)
    environ = code_environ(code, env)
    with tempfile.TemporaryDirectory(prefix="kvtrace-code-call-") as tmp:
        kw, res = Path(tmp) / "kwargs.json", Path(tmp) / "result.json"
        kw.write_text(json.dumps(kwargs or {}))
        t0 = time.perf_counter()
        out = _warm_call(target, kw, res, Path(tmp), environ, timeout_s) if warm.enabled() else None
        if out is None:
            cmd = [sys.executable, "-m", "replay.codes.entry", "call", target, str(kw), str(res)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=timeout_s)
        wall = round(time.perf_counter() - t0, 3)
        if not res.is_file():
            raise CodeCallError(f"{target} in {code.spec}: the process exited {out.returncode} without a result; "
                                f"stderr tail: {out.stderr[-2000:]}", stderr=out.stderr)
        data = json.loads(res.read_text())
    if not data["ok"]:
        raise CodeCallError(f"{target} in {code.spec}: {data['error']}", data.get("traceback", ""), out.stderr)
    return CodeRun(out.returncode, out.stdout, out.stderr, wall, data["result"], data.get("bootstrap"))


def _warm_call(target: str, kw: Path, res: Path, tmp: Path, environ: dict[str, str],
               timeout_s: float | None) -> subprocess.CompletedProcess | None:
    """The call in a fresh child of the code's warm parent (``replay.codes.warm``); None when
    none can start (the caller then runs it cold)."""
    w = warm.warm_for(environ)
    if w is None:
        return None
    out_p, err_p = tmp / "stdout.txt", tmp / "stderr.txt"
    try:
        rc = w.call(target, kw, res, out_p, err_p, environ, timeout_s)
    except RuntimeError:
        return None  # the warm parent died: this call runs cold, the next starts a new one
    read = (lambda p: p.read_text(errors="replace") if p.is_file() else "")
    return subprocess.CompletedProcess([target], rc, read(out_p), read(err_p))


__all__ = ["CodeCallError", "CodeRun", "call_in_code", "code_environ", "run_in_code"]
