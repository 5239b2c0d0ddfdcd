"""The sglang versions kvtrace supports, declared once for the hooks and the real-code backend.

Standard library only: ``replay.backends.sglang.env`` checks the version before importing
sglang, and the autoload checks it before installing any hook.
"""

from __future__ import annotations

SUPPORTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.23",)


class UnsupportedSglang(RuntimeError):
    """The installed sglang is not a version kvtrace was written and tested against."""


def sglang_version() -> str:
    """The installed sglang distribution's version (``PackageNotFoundError`` when absent)."""
    from importlib.metadata import version

    return version("sglang")


def check_version(version: str | None = None, *, what: str = "kvtrace's sglang hooks") -> str:
    """Return ``version`` (default: the installed one) if supported.

    Args:
        version: the version to check; None reads the installed distribution.
        what: the part of kvtrace that needs it, named in the error.
    Raises:
        UnsupportedSglang: naming the installed and the supported versions.
    """
    v = sglang_version() if version is None else version
    if v not in SUPPORTED_SGLANG_VERSIONS:
        raise UnsupportedSglang(
            f"sglang {v} is installed, but {what} support only sglang "
            f"{', '.join(SUPPORTED_SGLANG_VERSIONS)} (install it with `pip install --no-deps "
            f"sglang=={SUPPORTED_SGLANG_VERSIONS[-1]}`)")
    return v
