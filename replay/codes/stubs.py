"""Import stubs for the GPU-only packages a code (an sglang tree) imports at module level.

Runs inside a code's own process (see :mod:`replay.codes.bootstrap`); standard library only.

Each stubbed package (``triton``, ``torchvision``, ``sgl_kernel``, with every submodule) is
served by a ``sys.meta_path`` finder, and only when the real package is absent. A stub module
answers any attribute: a name that looks like a class gives a class (an exception class when
it ends in ``Error``/``Exception``), anything else a :class:`Absorber` that can be called,
subscripted, decorated with and iterated (empty). Two behaviours are deliberate:

- ``@triton.jit`` (bare or with arguments) gives a :class:`StubKernel`: *launching* it
  (``kernel[grid](...)``) raises :class:`StubKernelLaunched` naming the kernel, so a Triton
  kernel without a torch fallback (see :mod:`replay.codes.kernels`) fails loudly, never
  silently does nothing.
- ``sgl_kernel``'s values raise :class:`StubKernelLaunched` when called.

``triton.runtime.driver.active`` raises, so code probing the device at import time
(``fla/utils.py``) takes its no-GPU branch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

#: Packages stubbed when absent: name -> the version string the stub reports.
STUBBED_PACKAGES: dict[str, str] = {"triton": "3.5.0", "torchvision": "0.28.0", "sgl_kernel": "0.4.2.post2"}


class StubKernelLaunched(RuntimeError):
    """A stubbed GPU kernel was launched (no CPU fallback is installed for it)."""


def _dunder(attr: str) -> bool:
    return attr.startswith("__") and attr.endswith("__")


class Absorber:
    """A value that takes every import-time use: call, attribute, subscript, iteration (empty).

    Called with one callable and nothing else, it returns that callable (bare decorator use).
    With ``raise_on_call`` (``sgl_kernel``), any other call raises :class:`StubKernelLaunched`.
    """

    __slots__ = ("_name", "_raise")

    def __init__(self, name: str, raise_on_call: bool = False) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_raise", raise_on_call)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        if self._raise:
            raise StubKernelLaunched(f"{self._name} was called, but it is a kvtrace import stub on CPU")
        return Absorber(f"{self._name}()", self._raise)

    def __getattr__(self, attr: str):
        if _dunder(attr):
            raise AttributeError(attr)
        return Absorber(f"{self._name}.{attr}", self._raise)

    def __getitem__(self, key):
        return Absorber(f"{self._name}[]", self._raise)

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<kvtrace stub {self._name}>"


class StubKernel:
    """What ``@triton.jit`` returns: keeps the Python function; a launch raises."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__module__ = getattr(fn, "__module__", None)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise StubKernelLaunched(
                f"Triton kernel {self.__module__}.{self.__name__} was launched, but triton is a kvtrace "
                "import stub on CPU and no torch fallback is installed for it (replay/codes/kernels.py)")
        return launch

    def __call__(self, *args, **kwargs):
        return self[None](*args, **kwargs)

    def __getattr__(self, attr: str):
        if _dunder(attr):
            raise AttributeError(attr)
        return Absorber(f"{self.__name__}.{attr}")


def _jit(*args, **kwargs):
    """``triton.jit`` / ``triton.jit(...)`` / ``triton.autotune(...)``-style decorator."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return StubKernel(args[0])
    return lambda fn: StubKernel(fn) if callable(fn) else fn


class _StubMeta(type):
    def __getattr__(cls, attr: str):
        if _dunder(attr):
            raise AttributeError(attr)
        return Absorber(f"{cls.__module__}.{cls.__name__}.{attr}")


class _StubBase:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def __getattr__(self, attr: str):
        if _dunder(attr):
            raise AttributeError(attr)
        return Absorber(f"{type(self).__name__}().{attr}")


class _NoDriver:
    @property
    def active(self):
        raise RuntimeError("triton is a kvtrace import stub (no active driver on CPU)")


class StubModule(types.ModuleType):
    """A stub package module: every missing attribute is made once and kept."""

    def __getattr__(self, attr: str):
        if _dunder(attr):
            raise AttributeError(attr)
        if attr[:1].isupper() and not attr.isupper():
            is_error = attr.endswith(("Error", "Exception")) or attr == "OutOfResources"
            value = _StubMeta(attr, (Exception,) if is_error else (_StubBase,), {"__module__": self.__name__})
        else:
            value = Absorber(f"{self.__name__}.{attr}", raise_on_call=self.__name__.startswith("sgl_kernel"))
        setattr(self, attr, value)
        return value


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _populate(module: StubModule) -> None:
    name = module.__name__
    if name in STUBBED_PACKAGES:
        module.__version__ = STUBBED_PACKAGES[name]
    if name == "triton":
        module.cdiv = _cdiv
        module.next_power_of_2 = _next_power_of_2
        module.jit = _jit
        module.autotune = lambda *a, **k: (lambda fn: fn)
        module.heuristics = lambda *a, **k: (lambda fn: fn)
    elif name == "triton.runtime":
        module.driver = _NoDriver()


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        module.__kvtrace_stub__ = True
        _populate(module)
        return module

    def exec_module(self, module) -> None:
        return None


class StubFinder(importlib.abc.MetaPathFinder):
    """Serves ``<pkg>`` and ``<pkg>.*`` for each package in ``roots``."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots
        self._loader = _Loader()

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self._loader, is_package=True)


def _installed(name: str) -> bool:
    for finder in sys.meta_path:
        if isinstance(finder, StubFinder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is not None and find(name, None) is not None:
            return True
    return False


def install_stubs(names: tuple[str, ...] = tuple(STUBBED_PACKAGES)) -> tuple[str, ...]:
    """Stub each package of ``names`` that is not installed; returns the stubbed ones (idempotent)."""
    for finder in sys.meta_path:
        if isinstance(finder, StubFinder):
            return finder.roots
    roots = tuple(n for n in names if not _installed(n))
    if roots:
        sys.meta_path.append(StubFinder(roots))
    return roots


__all__ = ["Absorber", "STUBBED_PACKAGES", "StubFinder", "StubKernel", "StubKernelLaunched", "StubModule",
           "install_stubs"]
