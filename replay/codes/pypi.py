"""PyPI releases as codes: ``sglang==X`` is the release's wheel, downloaded once and unpacked.

:func:`prepare_release` gives the code dir of a release (a directory holding ``sglang/``):

- the wheel is fetched with the venv's own pip, ``pip download --no-deps --only-binary=:all:
  sglang==X`` (:func:`download_wheel`, the only network call; PyPI or the index pip is set up
  for), into a temporary directory of the cache;
- it is unpacked (a zip; absolute names, ``..`` and links skipped) into ``<cache>/code/<key>/``,
  ``key`` = SHA-256 of the wheel's bytes (first 16 hex digits), as a tarball is;
- ``<cache>/pypi/sglang-X.json`` maps the release to its key, and the wheel is deleted: a
  second prepare reads that file and finds the code dir (no network, no hashing).

A release pip cannot download (no such version, no network) is refused with
:class:`~replay.codes.prepare.CodePrepareError` naming the version and pip's error, on one line.
Which release the *installed* one is (``sglang==0.5.23`` means the venv's sglang) is decided by
the caller (:func:`replay.runs.code.resolve_code`), not here. Standard library only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from replay.codes.sources import CodePrepareError, _python_dir_of, _sha_file, staged_dir

#: ``sglang==X`` with X a version (PEP 440 characters)
RELEASE_RE = re.compile(r"sglang==([0-9][0-9A-Za-z.+!_-]*)")
#: seconds pip may take to download a wheel
DOWNLOAD_TIMEOUT_S = 600


def release_version(spec: str) -> str | None:
    """``sglang==0.5.22`` -> ``0.5.22``; None for any other spec.

    Raises:
        CodePrepareError: ``sglang==`` followed by something that is no version.
    """
    text = str(spec).strip()
    if not text.startswith("sglang=="):
        return None
    m = RELEASE_RE.fullmatch(text)
    if m is None:
        raise CodePrepareError(f"{text}: expected sglang==VERSION (a PyPI release, e.g. sglang==0.5.23)")
    return m.group(1)


def pip_error(text: str) -> str:
    """pip's output reduced to one line: its ``ERROR:`` lines (a long ``from versions:`` list
    shortened to its ends), and a hint when it could not reach the index."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    errors = [ln[len("ERROR:"):].strip() for ln in lines if ln.startswith("ERROR:")] or lines[-1:] or ["no output"]

    def short(m: re.Match) -> str:
        versions = [v.strip() for v in m.group(1).split(",") if v.strip()]
        if len(versions) <= 6:
            return m.group(0)
        return f"(from versions: {', '.join(versions[:2])}, ..., {', '.join(versions[-3:])}; {len(versions)} in all)"

    said = " | ".join(re.sub(r"\(from versions: ([^)]*)\)", short, e) for e in errors)
    offline = any(k in ln for ln in lines for k in ("NewConnectionError", "Failed to establish", "name resolution",
                                                    "Network is unreachable", "ConnectTimeout", "ProxyError"))
    return said + ("; the index could not be reached (no network?)" if offline else "")


def download_wheel(version: str, dest: Path) -> Path:
    """Download the wheel of ``sglang==version`` into ``dest``; returns its path.

    Raises:
        CodePrepareError: pip failed (message: the version and pip's error, one line).
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "--retries", "1", "--timeout", "30", "--dest", str(dest),
           f"sglang=={version}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CodePrepareError(f"sglang=={version}: pip download took over {DOWNLOAD_TIMEOUT_S} s") from None
    if out.returncode != 0:
        raise CodePrepareError(f"sglang=={version}: pip could not download it: "
                               f"{pip_error(out.stderr + chr(10) + out.stdout)}")
    wheels = sorted(dest.glob("sglang-*.whl"))
    if not wheels:
        raise CodePrepareError(f"sglang=={version}: pip downloaded no sglang wheel into {dest} "
                               f"(found {sorted(p.name for p in dest.iterdir())})")
    return wheels[0]


def _safe_names(zf: zipfile.ZipFile) -> list[str]:
    out = []
    for info in zf.infolist():
        name = Path(info.filename)
        is_link = (info.external_attr >> 16) & 0o170000 == 0o120000
        if name.is_absolute() or ".." in name.parts or is_link:
            continue
        out.append(info.filename)
    return out


def unpack_wheel(wheel: Path, dest: Path) -> Path:
    """Unpack ``wheel`` into ``dest`` (atomic: a temporary sibling renamed); returns the code dir
    (``dest``, holding ``sglang/``).

    Raises:
        CodePrepareError: not a zip, or no ``sglang/__init__.py`` in it.
    """
    with staged_dir(dest) as tmp:
        try:
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(tmp, members=_safe_names(zf))
        except zipfile.BadZipFile as e:
            raise CodePrepareError(f"{wheel.name}: not a wheel (zip): {e}") from None
        if _python_dir_of(tmp) != tmp:
            raise CodePrepareError(f"{wheel.name}: holds no sglang/__init__.py")
    return dest


def prepare_release(version: str, root: Path) -> tuple[Path, str, bool, dict]:
    """The code dir of ``sglang==version`` under the cache ``root`` (see the module docstring).

    Returns:
        (code dir, content key, whether it was cached, step timings in seconds).
    Raises:
        CodePrepareError: pip failed, or the wheel holds no sglang.
    """
    index = root / "pypi" / f"sglang-{version}.json"
    if index.is_file():
        try:
            sha = json.loads(index.read_text())["sha"]
            if _python_dir_of(root / "code" / sha) is not None:
                return root / "code" / sha, sha, True, {}
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged entry: download again
    steps: dict = {}
    index.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".sglang-{version}-", dir=index.parent) as tmp:
        t = time.perf_counter()
        wheel = download_wheel(version, Path(tmp))
        steps["download_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        sha = _sha_file(wheel)[:16]
        steps["hash_s"] = round(time.perf_counter() - t, 4)
        dest = root / "code" / sha
        if _python_dir_of(dest) is None:
            t = time.perf_counter()
            unpack_wheel(wheel, dest)
            steps["unpack_s"] = round(time.perf_counter() - t, 3)
        part = index.with_name(index.name + ".tmp")
        part.write_text(json.dumps({"spec": f"sglang=={version}", "sha": sha, "wheel": wheel.name}))
        part.replace(index)
    return dest, sha, False, steps


__all__ = ["download_wheel", "pip_error", "prepare_release", "release_version", "unpack_wheel"]
