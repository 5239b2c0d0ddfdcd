"""Prepare a code (an sglang source tree) to run on CPU: unpacked once, cached by content.

A *code spec* is a tarball holding ``python/sglang`` (``.tar.xz``, ``.tar.gz``, ``.tgz``,
``.tar``; the shared ``sglang-pre659.tar.xz`` / ``sglang-post659.tar.xz``), a directory holding
``python/sglang`` or ``sglang/``, or ``sglang==X`` (a PyPI release). :func:`prepare` gives a
:class:`CodeEnv`:

- **code dir**: a tarball is unpacked into ``<cache>/code/<sha256[:16]>/`` (key: the tarball's
  bytes), once; a directory is used in place, keyed by a hash of its ``sglang`` tree's files; a
  release's wheel is downloaded with pip and unpacked the same way, keyed by the wheel's bytes
  (:mod:`replay.codes.pypi`; ``<cache>/pypi/sglang-X.json`` finds it again without the network).
- **overlay**: the light pins the code needs that the main venv does not match
  (:func:`overlay_pins`: the code's ``transformers==X`` pin from its ``pyproject.toml`` with the
  companions :data:`COMPANION_PINS` lists), installed with the venv's own pip
  ``install --no-deps --target <cache>/overlay/<sha256(pins)[:16]>/`` once and shared by every
  code with the same pins. torch stays the venv's. A release's wheel has no ``pyproject.toml``,
  so it gets no overlay (its ``METADATA`` pins are not read).

``<cache>`` is ``$KVTRACE_CODES_DIR``, else ``.kvtrace-codes/`` in the repository root
(git-ignored). Entries are made in a temporary sibling and renamed into place, so a killed
prepare leaves no half entry; a finished entry holds ``kvtrace-code.json``.

Nothing here imports the code, torch or sglang (standard library only).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from replay.codes.sources import CodePrepareError, _python_dir_of, _sha_file, _sha_tree, staged_dir

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Pins installed next to a code's ``transformers`` pin (measured: transformers 5.6.0 imports
#: with tokenizers 0.22.2 and huggingface-hub 1.33.0; newer transformers fail on the fork with
#: "'qwen3_asr' is already used").
COMPANION_PINS: dict[str, tuple[str, ...]] = {
    "5.6.0": ("tokenizers==0.22.2", "huggingface-hub==1.33.0"),
}

_TARBALL_SUFFIXES = (".tar.xz", ".tar.gz", ".tgz", ".tar", ".tar.bz2")
_MARKER = "kvtrace-code.json"


@dataclass(frozen=True)
class CodeEnv:
    """A prepared code.

    Attributes:
        spec: the spec as given.
        sha: content key of the code (16 hex digits).
        python_dir: the directory to put first on ``PYTHONPATH`` (it holds ``sglang/``).
        overlay_dir: the pins' ``--target`` directory (``None`` when no pin is needed).
        pins: the overlay's pins.
        cached: whether both parts were already prepared.
        prepare_s: wall seconds :func:`prepare` took.
    """

    spec: str
    sha: str
    python_dir: Path
    overlay_dir: Path | None
    pins: tuple[str, ...] = ()
    cached: bool = True
    prepare_s: float = 0.0
    steps: dict = field(default_factory=dict)

    def pythonpath(self) -> list[str]:
        """``PYTHONPATH`` entries in order: code, overlay, this repository (for ``replay``)."""
        out = [str(self.python_dir)]
        if self.overlay_dir is not None:
            out.append(str(self.overlay_dir))
        out.append(str(REPO_ROOT))
        return out

    def as_dict(self) -> dict:
        d = asdict(self)
        d["python_dir"] = str(self.python_dir)
        d["overlay_dir"] = None if self.overlay_dir is None else str(self.overlay_dir)
        d["pins"] = list(self.pins)
        return d


def cache_root() -> Path:
    """``$KVTRACE_CODES_DIR`` or ``<repo>/.kvtrace-codes``."""
    env = os.environ.get("KVTRACE_CODES_DIR")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / ".kvtrace-codes"


def _is_tarball(path: Path) -> bool:
    return path.is_file() and path.name.endswith(_TARBALL_SUFFIXES)


def _safe_members(tar: tarfile.TarFile):
    for m in tar.getmembers():
        name = Path(m.name)
        if name.is_absolute() or ".." in name.parts or m.issym() or m.islnk():
            continue
        yield m


def _unpack(tarball: Path, dest: Path) -> Path:
    """Unpack into ``dest`` (atomic: a temporary sibling renamed); returns the python dir."""
    with staged_dir(dest) as tmp:
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, members=list(_safe_members(tar)))
        if _python_dir_of(tmp) is None:
            raise CodePrepareError(f"{tarball}: holds no python/sglang/__init__.py nor sglang/__init__.py")
    return _python_dir_of(dest)


def _pyproject_pin(python_dir: Path, package: str) -> str | None:
    pyproject = python_dir / "pyproject.toml"
    if not pyproject.is_file():
        return None
    m = re.search(rf'"{re.escape(package)}==([^";\s]+)', pyproject.read_text(errors="replace"))
    return m.group(1) if m else None


def _installed_version(package: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def overlay_pins(python_dir: Path) -> tuple[str, ...]:
    """The pins a code needs over the main venv: its ``transformers`` pin and companions.

    Empty when the code pins no transformers or pins the version the venv has.
    """
    version = _pyproject_pin(python_dir, "transformers")
    if version is None or version == _installed_version("transformers"):
        return ()
    return (f"transformers=={version}",) + COMPANION_PINS.get(version, ())


def _install_overlay(pins: tuple[str, ...], root: Path) -> tuple[Path, bool]:
    key = hashlib.sha256("\n".join(sorted(pins)).encode()).hexdigest()[:16]
    dest = root / "overlay" / key
    if (dest / _MARKER).is_file():
        return dest, True
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=dest.parent))
    try:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--target", str(tmp), *pins]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            tail = (out.stderr or out.stdout).strip().splitlines()[-5:]
            raise CodePrepareError(f"pip could not install the overlay pins {list(pins)}: " + " | ".join(tail))
        (tmp / _MARKER).write_text(json.dumps({"pins": list(pins)}))
        try:
            tmp.rename(dest)
        except OSError:
            if not (dest / _MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest, False


def prepare(spec: str | os.PathLike, *, pins: tuple[str, ...] | None = None) -> CodeEnv:
    """Prepare ``spec`` (see the module docstring); cheap when already prepared.

    Args:
        spec: tarball, directory or ``sglang==X``.
        pins: the overlay's pins; default :func:`overlay_pins` of the code.
    Returns:
        :class:`CodeEnv`.
    Raises:
        CodePrepareError: the spec does not exist, holds no sglang, or pip fails (a release pip
            cannot download, an overlay pin).
    """
    from replay.codes import pypi

    t0 = time.perf_counter()
    text = str(spec)
    root = cache_root()
    steps = {}
    version = pypi.release_version(text)
    path = Path(text).expanduser()
    if version is not None:
        python_dir, sha, code_cached, steps = pypi.prepare_release(version, root)
    elif not path.exists():
        raise CodePrepareError(f"{text}: no such file or directory (expected a tarball or a directory "
                               "holding python/sglang or sglang/)")
    elif _is_tarball(path.resolve()):
        path = path.resolve()
        t = time.perf_counter()
        sha = _sha_file(path)[:16]
        steps["hash_s"] = round(time.perf_counter() - t, 4)
        dest = root / "code" / sha
        code_cached = _python_dir_of(dest) is not None
        if code_cached:
            python_dir = _python_dir_of(dest)
        else:
            t = time.perf_counter()
            python_dir = _unpack(path, dest)
            steps["unpack_s"] = round(time.perf_counter() - t, 3)
    elif path.is_dir():
        path = path.resolve()
        python_dir = _python_dir_of(path)
        if python_dir is None:
            raise CodePrepareError(f"{text}: a directory without python/sglang/__init__.py or sglang/__init__.py")
        t = time.perf_counter()
        sha = _sha_tree(python_dir / "sglang")[:16]
        steps["hash_s"] = round(time.perf_counter() - t, 4)
        code_cached = True
    else:
        raise CodePrepareError(f"{text}: not a tarball ({', '.join(_TARBALL_SUFFIXES)}) nor a directory")
    pins = overlay_pins(python_dir) if pins is None else tuple(pins)
    overlay, overlay_cached = None, True
    if pins:
        t = time.perf_counter()
        overlay, overlay_cached = _install_overlay(pins, root)
        if not overlay_cached:
            steps["pip_s"] = round(time.perf_counter() - t, 3)
    return CodeEnv(spec=text, sha=sha, python_dir=python_dir, overlay_dir=overlay, pins=pins,
                   cached=code_cached and overlay_cached, prepare_s=round(time.perf_counter() - t0, 4), steps=steps)


__all__ = ["COMPANION_PINS", "CodeEnv", "CodePrepareError", "cache_root", "overlay_pins", "prepare"]
