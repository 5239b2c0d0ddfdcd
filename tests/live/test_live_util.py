"""The live tests' port picker: a server binds its ports seconds after the test picks them."""

from __future__ import annotations

import socket

import pytest

from tests.live import live_util as lu


def test_free_port_lies_below_the_ephemeral_range_and_below_sglangs_own_pick():
    # bind(0) and outgoing connects draw from the ephemeral range, so a port picked there can be
    # taken before the server binds it (CI stop 45: the fork's TCPStore failed with EADDRINUSE).
    for _ in range(50):
        port = lu.free_port(offsets=(0, 1))
        assert 10_000 <= port and port + 1 < min(22_000, lu._ephemeral_low())


def test_free_port_skips_a_port_that_is_taken():
    port = lu.free_port(offsets=(0, 1))
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        for _ in range(20):
            assert lu.free_port(low=port, high=port + 1) == port + 1
        with pytest.raises(RuntimeError, match="no free port"):
            lu.free_port(offsets=(0, 1), low=port - 1, high=port)  # port - 1 needs port too


def test_free_port_falls_back_to_the_kernels_pick_only_where_no_port_lies_below_the_range():
    low = lu._ephemeral_low()
    assert lu.free_port(low=low, high=low + 300) >= low  # nothing below: bind(0), as before
    with pytest.raises(RuntimeError, match="below the ephemeral range"):  # no fallback for runs of ports
        lu.free_port(offsets=(0, 1), low=low, high=low + 300)
