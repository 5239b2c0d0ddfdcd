"""``wait_readable``: wait for a file descriptor to become readable, with ``poll`` (not ``select``).

``select.select`` refuses descriptors numbered 1024 and above ("filedescriptor out of range in
select()"), and a server process (sockets, shared memory, ZMQ contexts) or a long-lived notebook
easily holds that many. ``poll`` has no such limit. Standard library only (runs inside the server).
"""

from __future__ import annotations

import select


def wait_readable(fd, timeout_s: float | None = None) -> bool:
    """True when ``fd`` (an int or an object with ``fileno()``) is readable, or at EOF/hang-up,
    within ``timeout_s`` seconds (None: wait as long as it takes); False on time-out."""
    p = select.poll()
    p.register(fd, select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR)
    ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
    while True:
        try:
            return bool(p.poll(ms))
        except InterruptedError:  # pragma: no cover - PEP 475 retries poll itself
            continue
