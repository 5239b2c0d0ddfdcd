"""Small helpers for the commands' human output: plurals and "did you mean" suggestions."""

from __future__ import annotations

import difflib


def plural(n, word: str, many: str | None = None) -> str:
    """``1 slot``, ``2 slots``, ``1,234 rows`` (``many`` for irregular plurals)."""
    num = int(n) if float(n).is_integer() else float(n)
    return f"{num:,} {word if abs(num) == 1 else (many or word + 's')}"


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean X?)`` for the closest of ``choices`` to ``word``, else ``""``."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


__all__ = ["plural", "did_you_mean"]
