"""wait_readable works on descriptors select() refuses (>= 1024), times out, and sees EOF."""

from __future__ import annotations

import os
import resource

import pytest

from tracer.fdwait import wait_readable


def test_high_numbered_descriptor_is_waited_on():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1600:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard}: cannot place a descriptor above 1024 to test")
    if soft <= 1600:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard if hard != resource.RLIM_INFINITY else 4096), hard))
    r, w = os.pipe()
    hi = 1500
    os.dup2(r, hi)
    try:
        assert wait_readable(hi, 0.01) is False  # nothing written: time-out
        os.write(w, b"x")
        assert wait_readable(hi, 5.0) is True
        assert os.read(hi, 1) == b"x"
        os.close(w)
        assert wait_readable(hi, 5.0) is True  # EOF counts as readable
        assert os.read(hi, 1) == b""
    finally:
        os.close(hi)
        os.close(r)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_file_object_with_fileno():
    r, w = os.pipe()
    with os.fdopen(r, "rb", buffering=0) as f:
        assert wait_readable(f, 0) is False
        os.write(w, b"y")
        assert wait_readable(f, None) is True
    os.close(w)
