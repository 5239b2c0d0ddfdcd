"""The autoload watcher coexists with another import hook that, like it, asks the whole
sys.meta_path for a module: neither recurses into the other (a bench step timer did, and the
server died at start-up with RecursionError)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOOT = ROOT / "tracer" / "sglang" / "activation" / "autoload_boot.py"

CHILD = r"""
import importlib.abc, importlib.util, sys
exec(compile(open(BOOT).read(), BOOT, "exec"), {"__name__": "kvtrace_autoload_boot"})
assert "_kvtrace_autoload_watcher" in sys.modules, "watcher not armed"

class Chaining(importlib.abc.MetaPathFinder):  # no guard of its own, as a careless hook would be
    def find_spec(self, fullname, path=None, target=None):
        if fullname != NAME:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None

sys.meta_path.insert(0, Chaining())
spec = importlib.util.find_spec(NAME)
print("found" if spec is not None else "none", type(spec.loader).__name__ if spec else "")
"""


def test_watcher_and_another_chaining_finder_do_not_recurse(tmp_path):
    name = "json.decoder"  # stands in for a watched sglang module (no sglang import needed)
    code = (
        f"BOOT = {str(BOOT)!r}\nNAME = {name!r}\n"
        + "import sys\n"
        + "src = open(BOOT).read().replace('WATCHED = frozenset((', 'WATCHED = frozenset((' + repr(NAME) + ', ', 1)\n"
        + "BOOT_SRC = src\n"
        + CHILD.replace('exec(compile(open(BOOT).read(), BOOT, "exec")', 'exec(compile(BOOT_SRC, BOOT, "exec")')
    )
    env = dict(os.environ, KVTRACE_DIR=str(tmp_path / "trace"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RecursionError" not in out.stderr
    assert out.stdout.split()[0] == "found"
    assert out.stdout.split()[1] == "_Loader"  # the watcher still wrapped the loader
