"""Make the real sglang 0.5.23 importable and drivable on a CPU-only machine.

One call, :func:`bootstrap`, does everything (idempotent, thread-safe):

1. **Code check.** The importable sglang must be the ``sglang-0.5.23`` target, recognized from
   its source files (``tracer.sglang.targets``: fingerprint, else names and signatures), never
   from the version string; otherwise :class:`UnsupportedSglangVersion` says what was found.
   The check reads files only, so it runs *before* ``import sglang`` (which needs the stubs).
2. **Import stubs** for ``triton`` and ``torchvision`` (and all their submodules), installed
   only when the real package is absent. sglang imports both at module level, but on CPU no
   Triton kernel and no torchvision transform ever runs (``supports_triton`` is False, so the
   allocators take their torch paths). The stubs are catch-all mock modules served by a
   ``sys.meta_path`` finder whose loader's ``create_module`` returns the mock itself (a spec
   with no loader would make the import system build an empty namespace module instead).
3. **Host data-copy no-ops** (:data:`HOST_COPY_NOOPS`): the only places where the real backend
   does not run the real code. They turn host<->device KV *data* movement into no-ops; all
   bookkeeping (slot allocation, tree state, locks, acks) stays the real code.

Usage::

    from replay.backends.sglang.env import bootstrap
    info = bootstrap()          # then `import sglang.srt...` works on CPU

This module imports only the standard library and ``tracer.sglang.versions`` (where the supported
versions are declared once) at import time; torch and sglang are imported inside :func:`bootstrap`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import threading
import types
from dataclasses import dataclass, field

from tracer.sglang.versions import (SUPPORTED_SGLANG_VERSIONS, UnsupportedSglang, check_target,
                                    check_version)


#: Packages stubbed when absent: name -> version string the stub reports.
STUBBED_PACKAGES: dict[str, str] = {"triton": "3.5.0", "torchvision": "0.28.0"}

#: (module, qualified attribute) replaced by a no-op when HiCache runs on CPU. Each entry moves
#: KV *data* only (cudaHostRegister of pinned host buffers, host<->device copies); slot and
#: tree bookkeeping around them is untouched real code.
HOST_COPY_NOOPS: tuple[tuple[str, str], ...] = (
    ("sglang.srt.mem_cache.pool_host.common", "_cuda_host_register"),
    ("sglang.srt.mem_cache.pool_host.mha", "MHATokenToKVPoolHost.backup_from_device_all_layer"),
    ("sglang.srt.mem_cache.pool_host.mha", "MHATokenToKVPoolHost.load_to_device_per_layer"),
    ("sglang.srt.mem_cache.pool_host.mha", "MHATokenToKOnlyPoolHost.backup_from_device_all_layer"),
    ("sglang.srt.mem_cache.pool_host.mha", "MHATokenToKOnlyPoolHost.load_to_device_per_layer"),
    ("sglang.srt.mem_cache.pool_host.mla", "MLATokenToKVPoolHost.backup_from_device_all_layer"),
    ("sglang.srt.mem_cache.pool_host.mla", "MLATokenToKVPoolHost.load_to_device_per_layer"),
)


#: The one exception for an unsupported sglang (declared in ``tracer.sglang.versions``).
UnsupportedSglangVersion = UnsupportedSglang


class SglangNotInstalled(ImportError):
    """sglang is not installed in this environment."""


@dataclass(frozen=True)
class BootstrapInfo:
    """What :func:`bootstrap` did.

    Attributes:
        sglang_version: installed sglang version.
        stubbed: packages served by import stubs (empty when all were really installed).
        noops: ``module:attribute`` names replaced by no-ops (empty with ``host_noops=False``).
    """

    sglang_version: str
    stubbed: tuple[str, ...] = ()
    noops: tuple[str, ...] = field(default=())


# --------------------------------------------------------------------------------------------
# Catch-all stub modules
# --------------------------------------------------------------------------------------------
class _Anything:
    """A value that absorbs every use a module-level import of triton/torchvision makes of it.

    Calling it with one callable and no keywords returns that callable (bare decorator use such
    as ``@triton.jit``); any other call, attribute access or subscript gives another
    ``_Anything`` (decorator factories such as ``@triton.autotune(configs=...)``, ``kernel[grid]``).
    """

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Anything(f"{self._name}()")

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Anything(f"{self._name}.{attr}")

    def __getitem__(self, key):
        return _Anything(f"{self._name}[]")

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<kvtrace stub {self._name}>"


class _StubClassMeta(type):
    """Metaclass of stub classes: class attributes (enum members, ...) are sentinels."""

    def __getattr__(cls, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Anything(f"{cls.__module__}.{cls.__name__}.{attr}")


class _StubInstanceBase:
    """Base of stub classes: any constructor arguments; attributes are ``_Anything``."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Anything(f"{type(self).__name__}().{attr}")


def _is_class_name(attr: str) -> bool:
    return attr[:1].isupper() and not attr.isupper()


class _StubModule(types.ModuleType):
    """A package module whose every missing attribute is a stub class or an ``_Anything``."""

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        if _is_class_name(attr):
            is_error = attr.endswith(("Error", "Exception")) or attr == "OutOfResources"
            base = (Exception,) if is_error else (_StubInstanceBase,)
            value = _StubClassMeta(attr, base, {"__module__": self.__name__})
        else:
            value = _Anything(f"{self.__name__}.{attr}")
        setattr(self, attr, value)  # stable identity on repeated access
        return value


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


class _NoTritonDriver:
    """``triton.runtime.driver``: no active driver on CPU. Modules probing the device at import
    (``fla/utils.py``: ``driver.active.get_current_target().backend`` inside ``try``) fall back
    to ``"cpu"`` as they do without a GPU, instead of taking a stub value as a device name."""

    @property
    def active(self):
        raise RuntimeError("triton is an import stub of kvtrace (no active driver on CPU)")


def _populate(module: _StubModule) -> None:
    """Real values for the few names used *as values* at import time (not just referenced)."""
    top = module.__name__.split(".")[0]
    if module.__name__ == top:
        module.__version__ = STUBBED_PACKAGES[top]
    if module.__name__ == "triton":
        module.cdiv = _cdiv
        module.next_power_of_2 = _next_power_of_2
    if module.__name__ == "triton.runtime":
        module.driver = _NoTritonDriver()


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []  # a package: every submodule import comes back to the finder
        module.__kvtrace_stub__ = True
        _populate(module)
        return module

    def exec_module(self, module) -> None:
        return None


class _StubFinder(importlib.abc.MetaPathFinder):
    """Serves ``<pkg>`` and ``<pkg>.*`` from stubs for each package in ``roots``."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots
        self._loader = _StubLoader()

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self._loader, is_package=True)


def _really_installed(name: str) -> bool:
    """True when ``name`` can be found by the normal finders (our stub finder excluded)."""
    for finder in sys.meta_path:
        if isinstance(finder, _StubFinder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is not None and find(name, None) is not None:
            return True
    return False


def install_import_stubs() -> tuple[str, ...]:
    """Install stubs for each package of :data:`STUBBED_PACKAGES` that is absent.

    Returns:
        the names now served by stubs (already-installed stubs included).
    Mutates:
        ``sys.meta_path`` (appends one finder, once).
    """
    existing = [f for f in sys.meta_path if isinstance(f, _StubFinder)]
    if existing:
        return existing[0].roots
    roots = []
    for name in STUBBED_PACKAGES:
        mod = sys.modules.get(name)
        if mod is not None and not getattr(mod, "__kvtrace_stub__", False):
            continue  # the real package is already imported
        if not _really_installed(name):
            roots.append(name)
    if roots:
        sys.meta_path.append(_StubFinder(tuple(roots)))
    return tuple(roots)


# --------------------------------------------------------------------------------------------
# Version check and host-copy no-ops
# --------------------------------------------------------------------------------------------
def installed_sglang_version() -> str:
    """Version of the installed sglang distribution (no import of sglang).

    Raises:
        SglangNotInstalled: when sglang is not installed.
    """
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise SglangNotInstalled(
            "sglang is not installed; install it with `pip install --no-deps sglang=="
            f"{SUPPORTED_SGLANG_VERSIONS[-1]}` plus `pip install kvtrace[sglang]` (see docs/sglang.md)"
        ) from None


def check_sglang_version(version: str | None = None) -> str:
    """Refuse sglang code that is not the ``sglang-0.5.23`` target (recognized from its code,
    ``tracer.sglang.targets``: a ``0.5.23.post1`` or ``+local`` build of it replays).

    Args:
        version: None: check the importable code; a string: check that version string's release.
    Returns:
        the installed version string (or the one passed).
    Raises:
        SglangNotInstalled: no sglang importable.
        UnsupportedSglangVersion: naming what was found and what is supported.
    """
    if version is not None:
        return check_version(version, what="kvtrace's real-code backend")
    from tracer.sglang.targets import source

    if source.sglang_root() is None:
        installed_sglang_version()  # raises SglangNotInstalled, with the install line
    d = check_target(what="kvtrace's real-code backend", targets=("sglang-0.5.23",))
    return d.sglang_version or SUPPORTED_SGLANG_VERSIONS[-1]


def _noop(*args, **kwargs) -> None:
    """Stands in for a host<->device data copy on CPU (see HOST_COPY_NOOPS)."""
    return None


_ORIGINALS: dict[tuple[str, str], object] = {}


def install_host_copy_noops() -> tuple[str, ...]:
    """Replace every entry of :data:`HOST_COPY_NOOPS` by :func:`_noop` (idempotent).

    Returns:
        ``module:attribute`` names patched.
    Mutates:
        the listed sglang classes/modules; originals kept for :func:`uninstall_host_copy_noops`.
    """
    done = []
    for mod_name, qual in HOST_COPY_NOOPS:
        owner = importlib.import_module(mod_name)
        *path, attr = qual.split(".")
        for part in path:
            owner = getattr(owner, part)
        key = (mod_name, qual)
        if key not in _ORIGINALS:
            _ORIGINALS[key] = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
            setattr(owner, attr, _noop)
        done.append(f"{mod_name}:{qual}")
    return tuple(done)


def uninstall_host_copy_noops() -> None:
    """Restore the originals replaced by :func:`install_host_copy_noops`."""
    for (mod_name, qual), original in list(_ORIGINALS.items()):
        owner = importlib.import_module(mod_name)
        *path, attr = qual.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, attr, original)
        del _ORIGINALS[(mod_name, qual)]


# --------------------------------------------------------------------------------------------
_LOCK = threading.RLock()
_INFO: BootstrapInfo | None = None


def bootstrap(*, host_noops: bool = True) -> BootstrapInfo:
    """Check the sglang version, install import stubs, and apply the host-copy no-ops.

    Args:
        host_noops: apply :data:`HOST_COPY_NOOPS` (imports the sglang host-pool modules). Off
            lets a caller get importability only, e.g. a server process with real GPUs.
    Returns:
        :class:`BootstrapInfo`.
    Raises:
        SglangNotInstalled, UnsupportedSglangVersion.
    Mutates:
        ``sys.meta_path`` (stub finder), the classes listed in HOST_COPY_NOOPS,
        ``os.environ`` default ``SGLANG_DEBUG_MEMORY_POOL`` left as is.
    """
    global _INFO
    with _LOCK:
        version = check_sglang_version()
        stubbed = install_import_stubs()
        noops: tuple[str, ...] = ()
        if host_noops:
            noops = install_host_copy_noops()
        _INFO = BootstrapInfo(sglang_version=version, stubbed=stubbed, noops=noops)
        return _INFO


__all__ = [
    "BootstrapInfo",
    "HOST_COPY_NOOPS",
    "STUBBED_PACKAGES",
    "SUPPORTED_SGLANG_VERSIONS",
    "SglangNotInstalled",
    "UnsupportedSglangVersion",
    "bootstrap",
    "check_sglang_version",
    "install_host_copy_noops",
    "install_import_stubs",
    "installed_sglang_version",
    "uninstall_host_copy_noops",
]
