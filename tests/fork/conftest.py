"""Fixtures of the fork tests: the DeepSeek-V4 fork's shared commits as prepared codes.

The tarballs live in ``../shared/targets/bytedance-dsv4/`` (relative to the repository); the
tests skip, with that reason, only when it is absent. ``make test`` prepares both codes first
(``make fork-env``); a test run without it prepares them here (same cache).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORK_DIR = ROOT.parent / "shared" / "targets" / "bytedance-dsv4"
COMMITS = ("pre659", "post659")


def fork_tarball(commit: str) -> Path:
    return FORK_DIR / f"sglang-{commit}.tar.xz"


def require_fork() -> None:
    if not FORK_DIR.is_dir():
        pytest.skip(f"{FORK_DIR} is absent (the fork's tarballs come with ../shared)")


@pytest.fixture(scope="session")
def fork_codes():
    """``{commit: CodeEnv}`` for both shared commits (prepared once, cached by content)."""
    require_fork()
    from replay.codes import prepare

    return {c: prepare(fork_tarball(c)) for c in COMMITS}
