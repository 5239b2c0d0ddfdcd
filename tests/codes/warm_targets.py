"""Functions called inside a code's process by tests/codes/test_warm.py."""

from __future__ import annotations

import os
import time

COUNTER = [0]


def facts(name: str) -> dict:
    import sglang

    COUNTER[0] += 1
    return {"env": os.environ.get(name), "cwd": os.getcwd(), "sglang": sglang.__file__, "pid": os.getpid(),
            "ppid": os.getppid(), "counter": COUNTER[0]}


def boom() -> None:
    raise ValueError("planted failure")


def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "woke"
