"""Which sglang code kvtrace supports, for the hooks and the real-code backend: decided by the
code (``tracer.sglang.targets``: names, signatures, source fingerprint), never by the version
string. ``SUPPORTED_SGLANG_VERSIONS`` names the upstream releases the targets were written on,
for messages and for checking a version string someone passes explicitly.

Standard library only: ``replay.backends.sglang.env`` checks the code before importing sglang,
and the autoload checks it before installing any hook.
"""

from __future__ import annotations

import re

SUPPORTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.23",)


class UnsupportedSglang(RuntimeError):
    """The sglang code here is no target kvtrace was written and tested against."""


def sglang_version() -> str:
    """The installed sglang distribution's version (``PackageNotFoundError`` when absent)."""
    from importlib.metadata import version

    return version("sglang")


def release_of(version: str) -> str:
    """``0.5.23.post1`` / ``0.5.23+local`` / ``0.5.23.dev3`` -> ``0.5.23`` (the release part)."""
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version)
    return m.group(1) if m else version


def check_target(*, what: str = "kvtrace's sglang hooks", targets: tuple[str, ...] | None = None,
                 root=None):
    """The ``Detection`` of the sglang code this interpreter imports, if it is a target.

    Args:
        what: the part of kvtrace that needs it, named in the error.
        targets: the target names ``what`` supports (default: any known target).
        root: the sglang package directory to read (default: the importable one).
    Raises:
        UnsupportedSglang: no target recognized (or not one of ``targets``), with the reason.
    """
    from tracer.sglang.targets import detect

    d = detect(root)
    if d.target is None or (targets is not None and d.target.name not in targets):
        got = d.reason if d.target is None else f"the code is {d.target.name}"
        want = ", ".join(targets) if targets else "a known target"
        raise UnsupportedSglang(
            f"{what} need {want}: {got} (install upstream sglang with `pip install --no-deps "
            f"sglang=={SUPPORTED_SGLANG_VERSIONS[-1]}`; to record what matches anyway, "
            "`kvtrace launch --partial` or KVTRACE_PARTIAL=1)")
    return d


def check_version(version: str | None = None, *, what: str = "kvtrace's sglang hooks") -> str:
    """Check the sglang code (``version`` None) or a version string someone passes.

    Args:
        version: None: recognize the importable code (``check_target``) and return the
            installed version string (or the target's name when there is no distribution);
            a string: accept it when its release part is supported (``0.5.23.post1``).
        what: the part of kvtrace that needs it, named in the error.
    Raises:
        UnsupportedSglang: naming what was found and what is supported.
    """
    if version is None:
        d = check_target(what=what)
        return d.sglang_version or d.target.name
    if release_of(version) not in SUPPORTED_SGLANG_VERSIONS:
        raise UnsupportedSglang(
            f"sglang {version} is named, but {what} support only sglang "
            f"{', '.join(SUPPORTED_SGLANG_VERSIONS)} (install it with `pip install --no-deps "
            f"sglang=={SUPPORTED_SGLANG_VERSIONS[-1]}`)")
    return version
