"""Entry point of a code's process: ``python -m replay.codes.entry MODE TARGET [ARGS]``.

Modes (after :func:`replay.codes.bootstrap.bootstrap`):

- ``call MODULE:FUNCTION KWARGS_JSON RESULT_JSON``: call ``FUNCTION(**kwargs)`` and write
  ``{"ok": true, "result": <JSON value>, "bootstrap": {...}}`` to ``RESULT_JSON``, or
  ``{"ok": false, "error": "...", "traceback": "..."}`` (exit 1) when it raises;
- ``module NAME [ARGS...]``: run a module as ``python -m NAME ARGS`` would;
- ``script PATH [ARGS...]``: run a script file as ``python PATH ARGS`` would.

Started by :mod:`replay.codes.runner`, which sets ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import json
import runpy
import sys
import traceback


def _call(target: str, kwargs_path: str, result_path: str) -> int:
    from replay.codes.bootstrap import bootstrap

    out: dict
    try:
        info = bootstrap()
        mod_name, _, func_name = target.partition(":")
        func = getattr(importlib.import_module(mod_name), func_name)
        with open(kwargs_path) as f:
            kwargs = json.load(f)
        out = {"ok": True, "result": func(**kwargs), "bootstrap": info.as_dict()}
        code = 0
    except BaseException as exc:  # reported to the parent, which raises or shows it
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        code = 1
    with open(result_path, "w") as f:
        json.dump(out, f, default=str)
    return code


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("call", "module", "script"):
        print("usage: python -m replay.codes.entry {call MODULE:FUNC KWARGS RESULT | module NAME ... | "
              "script PATH ...}", file=sys.stderr)
        return 2
    mode, target, rest = argv[0], argv[1], argv[2:]
    if mode == "call":
        return _call(target, *rest[:2])
    from replay.codes.bootstrap import bootstrap

    bootstrap()
    sys.argv = [target, *rest]
    if mode == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
