"""Small helpers for the commands' human output: plurals and "did you mean" suggestions."""

from __future__ import annotations

import difflib
import re


def plural(n, word: str, many: str | None = None) -> str:
    """``1 slot``, ``2 slots``, ``1,234 rows`` (``many`` for irregular plurals)."""
    num = int(n) if float(n).is_integer() else float(n)
    return f"{num:,} {word if abs(num) == 1 else (many or word + 's')}"


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean X?)`` for the closest of ``choices`` to ``word``, else ``""``."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: "<...> 'NAME'<...>; known <things>: a, b, c" (the refusals of knobs, presets, shapes, shape
#: parameters, backends): the last quoted name before the first ";" and the list after the colon.
_UNKNOWN = re.compile(r"^(?P<head>[^;]*'(?P<name>[^']+)')(?P<rest>[^;]*);\s*(?P<what>(?:known|valid)\b[^:]*):\s*(?P<list>.+)$",
                      re.S)


def suggest(message: str) -> str:
    """``message`` with `` (did you mean 'X'?)`` after the unknown name when one of the listed
    names is close to it; unchanged otherwise."""
    m = _UNKNOWN.match(message)
    if not m or "did you mean" in message:
        return message
    names = [n.strip() for n in re.split(r",\s*|\s+or\s+", m["list"]) if n.strip()]
    hint = did_you_mean(m["name"], [n for n in names if n != m["name"]])
    if not hint:
        return message
    return f"{m['head']}{hint}{m['rest']}; {m['what']}: {m['list']}"




def closing_log(capture) -> str:
    """``; sglang's log: PATH`` for a :class:`replay.console.Capture` that kept a log, else ``""``."""
    path = getattr(capture, "path", None)
    return f"; sglang's log: {path}" if path else ""


def force_out(out, force: bool, *, check: bool = True, inputs=()) -> None:
    """``--out`` of a command that writes a directory (``replay.outdir``'s rule): with ``force``
    remove ``out`` when it is a kvtrace directory (a trace, run, workload or sweep; anything else
    is refused, never deleted); without it refuse an existing non-empty ``out`` naming --force
    (``check=False``: leave that to the command, e.g. a sweep resumes in its directory).
    ``inputs``: the command's input paths; an ``out`` that is one of them or holds one is refused."""
    import shutil
    from pathlib import Path

    from replay.errors import KvtraceError
    from replay.outdir import check_new_dir

    o = Path(out).resolve()
    for src in inputs:
        s = Path(src).resolve()
        if s == o or o in s.parents:
            raise KvtraceError(f"--out {out}: is or holds the input {src}; expected a new directory "
                               "(--force never replaces what the command reads)")

    if force or check:
        if check_new_dir(out, "--out", force=force):
            shutil.rmtree(out)


__all__ = ["plural", "did_you_mean", "suggest", "closing_log", "force_out"]
