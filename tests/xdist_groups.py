"""How ``make test`` (``-n 2 --dist loadgroup``) shares the tests between its two xdist workers.

The unit of work is a **module**, or an ``xdist_group`` where one is marked (a group may span
modules): all of its tests run on one worker, so a module fixture (a server, a fork run, a
sweep) is computed once, not once on each worker, and no worker waits idle on
``tests/live/live_util.shared_once``'s lock while the other runs the server.

Two hooks, imported by ``tests/conftest.py``:

- :func:`pytest_collection_modifyitems` (on a worker) names the group in a grouped test's id,
  ``path::test[param]@group``, as pytest-xdist's own loadgroup does; its line for that sets
  ``item._nodeid``, which pytest >= 9.2 no longer reads (the id is the structured ``item._id``),
  so with pytest 9.2 and xdist 3.8 every ``xdist_group`` mark was silently ignored;
- :func:`pytest_xdist_make_scheduler` (on the controller) schedules by group, else by module
  (xdist's loadgroup would send each ungrouped test on its own).
"""

from __future__ import annotations

import dataclasses
import os

import pytest


def _loadgroup(config) -> bool:
    """``--dist loadgroup``: on the controller its ``dist``; on a worker (whose ``dist`` xdist
    resets to ``no``) the ``loadgroup`` flag xdist sets from it."""
    return config.getoption("dist", default="no") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


def group_of(item) -> str | None:
    """The ``xdist_group`` names of ``item`` joined as xdist joins them, or ``None``."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) or None


def _set_nodeid(item, nodeid: str) -> None:
    ident = getattr(item, "_id", None)
    if ident is not None and dataclasses.is_dataclass(ident) and hasattr(ident, "_str_cache"):
        new = dataclasses.replace(ident)  # pytest >= 9.2: str(item._id) is the nodeid
        object.__setattr__(new, "_str_cache", nodeid)
        item._id = new
    else:
        item._nodeid = nodeid  # pytest < 9.2


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    if not (os.environ.get("PYTEST_XDIST_WORKER") and _loadgroup(config)):
        return
    for item in items:
        group = group_of(item)
        if group is not None and not item.nodeid.endswith(f"@{group}"):  # xdist did not
            _set_nodeid(item, f"{item.nodeid}@{group}")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if not _loadgroup(config):
        return None
    from xdist.scheduler import LoadGroupScheduling

    class GroupOrModuleScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):
                return nodeid.split("@")[-1]
            return nodeid.split("::", 1)[0]

    return GroupOrModuleScheduling(config, log)
