"""The files behind a replay Scheduler's ZMQ ``ipc://`` names.

sglang's ``PortArgs.init_new`` names each inter-process channel after a
``tempfile.NamedTemporaryFile(delete=False)``: an empty file in the temporary directory that
nothing removes. A replay's Scheduler talks to no other process, so once it is built the files
are removed (without this every replay left 3-5 empty ``tmp*`` files in /tmp).
"""

from __future__ import annotations

import contextlib
import os


def remove_ipc_files(port_args) -> int:
    """Remove the files named by ``port_args``'s ``*_ipc_name`` fields (``ipc://PATH``); returns
    how many were removed (a missing file, or a name that is not ``ipc://``, is left alone)."""
    removed = 0
    for name, value in vars(port_args).items():
        if not (name.endswith("_ipc_name") and isinstance(value, str) and value.startswith("ipc://")):
            continue
        with contextlib.suppress(OSError):
            os.unlink(value[len("ipc://"):])
            removed += 1
    return removed


__all__ = ["remove_ipc_files"]
