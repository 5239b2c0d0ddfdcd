"""Make a code's sglang importable and drivable on CPU, inside that code's own process.

:func:`bootstrap` (idempotent) runs in a process whose ``PYTHONPATH`` starts with the code's
python dir and its overlay (see :mod:`replay.codes.runner`):

1. import stubs for ``triton``, ``torchvision``, ``sgl_kernel`` (and every submodule, e.g.
   ``sgl_kernel.kvcacheio``), each only when absent (:mod:`replay.codes.stubs`);
2. ``import triton.runtime`` before sglang (``fla/utils.py`` reads ``triton.runtime.driver``);
3. ``import sglang``, checked to come from ``$KVTRACE_CODE_PYTHON`` when that is set (so the
   venv's own sglang never stands in for the code);
4. the CPU stand-ins of :mod:`replay.codes.kernels` (paged allocator kernels in torch, host
   data-copy no-ops).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path


class WrongSglang(ImportError):
    """``import sglang`` did not give the code's sglang."""


@dataclass(frozen=True)
class CodeBootstrapInfo:
    """What :func:`bootstrap` did: where sglang came from, what was stubbed and patched."""

    sglang_file: str
    stubbed: tuple[str, ...]
    fallbacks: tuple[str, ...]
    noops: tuple[str, ...]

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


_LOCK = threading.Lock()
_INFO: list[CodeBootstrapInfo] = []


def bootstrap(*, host_noops: bool = True) -> CodeBootstrapInfo:
    """Stubs, ``import sglang`` (checked), CPU kernel fallbacks and host no-ops (see module doc).

    Raises:
        WrongSglang: sglang was imported from elsewhere than ``$KVTRACE_CODE_PYTHON``.
    """
    with _LOCK:
        if _INFO:
            return _INFO[0]
        from replay.codes.stubs import install_stubs
        from replay.codes import kernels

        stubbed = install_stubs()
        importlib.import_module("triton.runtime")  # before sglang: fla/utils.py reads triton.runtime.driver
        import sglang

        expected = os.environ.get("KVTRACE_CODE_PYTHON")
        got = Path(sglang.__file__).resolve()
        if expected and Path(expected).resolve() not in got.parents:
            raise WrongSglang(f"import sglang gave {got}, not the code under {expected} "
                              f"(sys.path[:3]={sys.path[:3]})")
        fallbacks = kernels.install_allocator_fallbacks()
        noops = kernels.install_host_copy_noops() if host_noops else ()
        info = CodeBootstrapInfo(sglang_file=str(got), stubbed=tuple(stubbed), fallbacks=fallbacks, noops=noops)
        _INFO.append(info)
        return info


__all__ = ["CodeBootstrapInfo", "WrongSglang", "bootstrap"]
