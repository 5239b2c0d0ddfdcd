# kvtrace live-server tests: import stubs for a real `python -m sglang.launch_server` on CPU.
#
# Put this directory on PYTHONPATH of the server (and of sglang's bench_serving client). At
# interpreter start-up it:
#   1. serves `triton` and `torchvision` from the catch-all stubs of
#      replay/backends/sglang/env.py (loaded by file path, so no package __init__ runs);
#   2. serves `sgl_kernel` (no CPU wheel; with SGLANG_USE_CPU_ENGINE=1 sglang imports it but, for
#      the tiny models and flags of tests/live, never calls it: every function raises
#      NotImplementedError) and `datasets` (imported by bench_serving at import time, used only by
#      datasets the tests do not use);
#   3. when KVTRACE_LIVE_SITE_DIR is set, adds that directory as a site dir, so a `.pth` written
#      there by `kvtrace hooks install-pth --site-dir` runs as it would from site-packages.
# Standard library only; stubs are installed only for packages that are really absent.
import importlib.abc
import importlib.machinery
import importlib.util
import os
import site
import sys
import types

_ENV_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                       "replay", "backends", "sglang", "env.py")
_EXTRA_ROOTS = ("sgl_kernel", "datasets")


def _load_env():
    spec = importlib.util.spec_from_file_location("_kvtrace_live_env", os.path.abspath(_ENV_PY))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


class _Raises:
    """A stub function: calling it says which stubbed function a test path reached."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name} is an import stub of kvtrace's live tests "
                                  "(no CPU build of this package)")

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _Raises(f"{self._name}.{attr}")


class _RaisingModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        if attr[:1].isupper():  # classes (e.g. datasets.Dataset used in annotations)
            value = type(attr, (), {"__module__": self.__name__})
        else:
            value = _Raises(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


class _RaisingLoader(importlib.abc.Loader):
    def create_module(self, spec):
        m = _RaisingModule(spec.name)
        m.__path__ = []
        m.__kvtrace_stub__ = True
        m.__version__ = "0.0.0+kvtrace.stub"
        return m

    def exec_module(self, module):
        return None


class _RaisingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, roots):
        self.roots, self.loader = roots, _RaisingLoader()

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self.loader, is_package=True)


def _absent(name):
    return importlib.machinery.PathFinder.find_spec(name) is None


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then()`` once the module ``name`` has finished loading."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                inner, then = spec.loader, self.then

                class _Loader(importlib.abc.Loader):
                    def create_module(self, spec):
                        return inner.create_module(spec)

                    def exec_module(self, module):
                        inner.exec_module(module)
                        then()

                spec.loader = _Loader()
                return spec
        return None


def _install():
    env_mod = _load_env()
    stubbed = env_mod.install_import_stubs()
    if os.environ.get("KVTRACE_LIVE_HOST_NOOPS") == "1":
        # HiCache on CPU: the host KV buffer is registered with cudaHostRegister and KV data is
        # copied host<->device by CUDA-only kernels; the same no-ops as the in-process backend
        # (replay/backends/sglang/env.py HOST_COPY_NOOPS), applied when sglang loads them.
        sys.meta_path.insert(0, _AfterImport("sglang.srt.mem_cache.pool_host.mha",
                                             env_mod.install_host_copy_noops))
    if "triton" in stubbed:
        # sglang probes `triton.runtime.driver.active...` inside try/except and falls back to
        # "cpu" on any exception; the catch-all stub would answer with a non-string instead.
        import triton.runtime

        triton.runtime.driver = _Raises("triton.runtime.driver")
        import triton.knobs  # srt/utils/triton_load_watch.py: no runtime knobs = nothing to watch

        triton.knobs.runtime = None
    roots = tuple(n for n in _EXTRA_ROOTS if _absent(n))
    if roots:
        sys.meta_path.append(_RaisingFinder(roots))
    extra_site = os.environ.get("KVTRACE_LIVE_SITE_DIR")
    if extra_site:
        site.addsitedir(extra_site)


try:
    _install()
except Exception as _e:  # never break interpreter start-up
    sys.stderr.write(f"kvtrace live stubs: not installed: {_e!r}\n")
