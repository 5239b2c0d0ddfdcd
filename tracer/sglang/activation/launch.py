"""The files that arm the autoload at interpreter start-up: the ``.pth`` line (``kvtrace hooks
install-pth``) and the ``sitecustomize`` shim of ``kvtrace launch``. Both execute
``autoload_boot.py`` by path when ``KVTRACE_DIR`` is set. Standard library only.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "kvtrace_autoload.pth"
BOOT_FILE = Path(__file__).with_name("autoload_boot.py")


def pth_line(boot: Path = BOOT_FILE) -> str:
    """The single line of the ``.pth`` file (executed by ``site`` at start-up)."""
    p = str(boot.resolve())
    return (
        "import os; _kvt_boot = " + repr(p) + "; "
        "os.environ.get('KVTRACE_DIR') and os.path.exists(_kvt_boot) and "
        "exec(compile(open(_kvt_boot).read(), _kvt_boot, 'exec'), "
        "{'__name__': 'kvtrace_autoload_boot'})\n"
    )


def site_packages() -> Path:
    """This interpreter's site-packages (purelib) directory."""
    return Path(sysconfig.get_paths()["purelib"])


def install_pth(target_dir: str | os.PathLike | None = None) -> Path:
    """Write ``kvtrace_autoload.pth`` into ``target_dir`` (default: site-packages). Idempotent.

    Returns: the path written.
    """
    d = Path(target_dir) if target_dir is not None else site_packages()
    p = d / PTH_NAME
    p.write_text(pth_line())
    return p


def uninstall_pth(target_dir: str | os.PathLike | None = None) -> bool:
    """Remove the ``.pth`` file; True when one was removed."""
    d = Path(target_dir) if target_dir is not None else site_packages()
    p = d / PTH_NAME
    if p.exists():
        p.unlink()
        return True
    return False


def pth_status(target_dir: str | os.PathLike | None = None) -> dict:
    d = Path(target_dir) if target_dir is not None else site_packages()
    p = d / PTH_NAME
    return {"pth": str(p), "installed": p.exists(),
            "current": p.exists() and p.read_text() == pth_line(),
            "armed_here": "_kvtrace_autoload_watcher" in sys.modules}


SITECUSTOMIZE = '''\
# kvtrace launch shim: arm the kvtrace autoload, then run any other sitecustomize.
import os as _os, sys as _sys
_kvt_boot = {boot!r}
try:
    if _os.environ.get("KVTRACE_DIR") and _os.path.exists(_kvt_boot):
        exec(compile(open(_kvt_boot).read(), _kvt_boot, "exec"), {{"__name__": "kvtrace_autoload_boot"}})
except Exception as _e:
    _sys.stderr.write("kvtrace: autoload not armed: %r\\n" % (_e,))
try:
    import importlib.machinery as _m, importlib.util as _u
    _here = _os.path.dirname(_os.path.abspath(__file__))
    _rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
    _spec = _m.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.loader is not None:
        _mod = _u.module_from_spec(_spec)
        _spec.loader.exec_module(_mod)
except Exception as _e:
    _sys.stderr.write("kvtrace: chained sitecustomize failed: %r\\n" % (_e,))
'''


def write_launch_shim(directory: str | os.PathLike) -> Path:
    """Write a ``sitecustomize.py`` shim into ``directory`` (to prepend to ``PYTHONPATH``)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    p = d / "sitecustomize.py"
    p.write_text(SITECUSTOMIZE.format(boot=str(BOOT_FILE.resolve())))
    return p
