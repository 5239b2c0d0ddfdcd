"""Strict JSONL reading for trace imports: every problem names the file, line and field."""

from __future__ import annotations

import hashlib
import json
import os
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from replay.workloads.errors import FormatError, WorkloadError

_MISSING = object()


class Line:
    """One parsed JSONL object with typed, validating field getters.

    Args:
        path: file name used in messages.
        number: 1-based line number.
        obj: the decoded JSON object.
    """

    def __init__(self, path: str, number: int, obj: dict):
        self.path, self.number, self.obj = path, number, obj

    def fail(self, field: str, problem: str) -> FormatError:
        return FormatError(self.path, self.number, field, problem)

    def _get(self, field: str, default):
        v = self.obj.get(field, _MISSING)
        if v is _MISSING:
            if default is _MISSING:
                raise self.fail(field, "missing")
            return default
        return v

    def int(self, field: str, minimum: int | None = 0, default=_MISSING, maximum: int = 2**31 - 1) -> int:
        """An integer field (bools rejected) in ``[minimum, maximum]`` (the column's type: int32
        by default)."""
        v = self._get(field, default)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(field, f"expected an integer, got {json.dumps(v)}")
        if minimum is not None and v < minimum:
            raise self.fail(field, f"expected an integer >= {minimum}, got {v}")
        if v > maximum:
            raise self.fail(field, f"expected an integer <= {maximum} (the column's type), got {v}")
        return v

    def scaled(self, field: str, scale: int) -> int:
        """A non-negative number times ``scale``, rounded to an integer exactly (no float error)."""
        v = self._get(field, _MISSING)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(field, f"expected a non-negative number, got {json.dumps(v)}")
        try:
            d = Decimal(v) if isinstance(v, int) else Decimal(repr(v))
        except InvalidOperation:
            raise self.fail(field, f"expected a non-negative number, got {v!r}") from None
        if not d.is_finite() or d < 0:
            raise self.fail(field, f"expected a non-negative number, got {v!r}")
        out = int((d * scale).to_integral_value())
        if out >= 2**63:
            raise self.fail(field, f"expected a number below {(2**63 - 1) // scale} (int64 ns), got {v!r}")
        return out

    def str_or_int(self, field: str, default=_MISSING):
        """A string or integer identifier."""
        v = self._get(field, default)
        if v is None or isinstance(v, bool) or not isinstance(v, (str, int)):
            raise self.fail(field, f"expected a string or integer id, got {json.dumps(v)}")
        return v

    def str(self, field: str, default=_MISSING) -> str:
        v = self._get(field, default)
        if not isinstance(v, str):
            raise self.fail(field, f"expected a string, got {json.dumps(v)}")
        return v

    def block_ids(self, field: str, input_len: int, block_tokens: int) -> list[int]:
        """A list of block ids covering ``input_len`` tokens in ``block_tokens`` blocks.

        Accepts between input_len // block_tokens and ceil(input_len / block_tokens) ids (the
        last, partial block may or may not have an id); ids are integers in [0, 2**64).
        """
        v = self._get(field, _MISSING)
        if not isinstance(v, list):
            raise self.fail(field, f"expected a list of block ids, got {json.dumps(v)[:60]}")
        for i, x in enumerate(v):
            if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < 2**64:
                raise self.fail(field, f"element {i}: expected an integer in [0, 2**64), got {json.dumps(x)}")
        lo, hi = input_len // block_tokens, -(-input_len // block_tokens)
        if not lo <= len(v) <= hi:
            need = f"{lo}" if lo == hi else f"{lo} to {hi}"
            raise self.fail(
                field,
                f"{len(v)} block ids do not match input_length {input_len} "
                f"(expected {need} ids of {block_tokens}-token blocks)",
            )
        return v


def read_lines(path: str | os.PathLike, progress: bool = False) -> Iterator[Line]:
    """Decoded objects of a JSONL file, skipping blank lines.

    Args:
        path: the file.
        progress: show a tqdm bar over bytes read.

    Yields:
        One ``Line`` per non-blank line.

    Raises:
        FormatError: a line is not valid JSON or not an object.
        WorkloadError: the file cannot be opened.
    """
    p = Path(path)
    try:
        f = open(p, "rb")
    except OSError as e:
        raise WorkloadError(f"{p}: cannot open ({e.strerror})") from None
    name = str(path)
    with f, tqdm(total=p.stat().st_size, unit="B", unit_scale=True, desc=f"read {p.name}",
                 disable=not progress, leave=False) as bar:
        for number, raw in enumerate(f, start=1):
            bar.update(len(raw))
            text = raw.strip()
            if not text:
                continue
            try:
                obj = json.loads(text)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise FormatError(name, number, "", f"invalid JSON ({getattr(e, 'msg', e)})") from None
            if not isinstance(obj, dict):
                raise FormatError(name, number, "", f"expected a JSON object, got {type(obj).__name__}")
            yield Line(name, number, obj)


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file (recorded in the manifest of imported workloads)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
