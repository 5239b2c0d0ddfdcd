# kvtrace autoload boot: executed (not imported) by the kvtrace .pth file or the launch shim, in
# every Python process started with KVTRACE_DIR set. Standard library only, and it imports
# nothing of kvtrace: it only arms a sys.meta_path watcher. When a watched sglang module has
# finished loading, the watcher imports tracer.sglang.activation.autoload, which installs the hooks.
# Costs nothing in processes that never import sglang. Idempotent (a second run is a no-op).
import os
import sys

WATCHED = frozenset((
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.schedule_policy",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.scheduler_components.pool_stats_observer",
    "sglang.srt.mem_cache.allocator.base",
    "sglang.srt.mem_cache.allocator.paged",
    "sglang.srt.mem_cache.allocator.swa",
    "sglang.srt.mem_cache.allocator.token",
    "sglang.srt.mem_cache.common",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.memory_pool_host",
    "sglang.srt.mem_cache.pool_host.base",
    "sglang.srt.mem_cache.pool_host.group",
    "sglang.srt.mem_cache.prefill_budget",
    "sglang.srt.mem_cache.unified_cache.component_type",
    "sglang.srt.mem_cache.unified_radix_cache",
    # the DeepSeek-V4 fork's layout (tracer.sglang.targets: bytedance-dsv4-*)
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.swa_memory_pool",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool",
    "sglang.srt.mem_cache.unified_cache_components",
))


def _kvtrace_arm():
    if "_kvtrace_autoload_watcher" in sys.modules or not os.environ.get("KVTRACE_DIR"):
        return
    import importlib.abc
    import threading
    import types

    def on_loaded(name):
        try:
            from tracer.sglang.activation import autoload

            autoload.on_module_loaded(name)
        except Exception as e:  # never break the import of sglang
            sys.stderr.write(f"kvtrace: autoload failed after importing {name}: {e!r}\n")

    class _Loader(importlib.abc.Loader):
        def __init__(self, inner, name):
            self.inner, self.name = inner, name

        def create_module(self, spec):
            return self.inner.create_module(spec)

        def exec_module(self, module):
            self.inner.exec_module(module)
            on_loaded(self.name)

        def __getattr__(self, attr):
            return getattr(self.inner, attr)

    busy = threading.local()  # names this thread is resolving: another finder that also asks
    # the whole sys.meta_path (as this one does) would otherwise recurse into us without end

    class Watcher(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname not in WATCHED:
                return None
            names = getattr(busy, "names", None)
            if names is None:
                names = busy.names = set()
            if fullname in names:
                return None
            names.add(fullname)
            try:
                for finder in sys.meta_path:
                    if finder is self or not hasattr(finder, "find_spec"):
                        continue
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                            spec.loader = _Loader(spec.loader, fullname)
                        return spec
                return None
            finally:
                names.discard(fullname)

    watcher = Watcher()
    sys.meta_path.insert(0, watcher)
    mod = types.ModuleType("_kvtrace_autoload_watcher")
    mod.watcher = watcher
    mod.WATCHED = WATCHED
    sys.modules["_kvtrace_autoload_watcher"] = mod


try:
    _kvtrace_arm()
except Exception as _e:  # pragma: no cover
    sys.stderr.write(f"kvtrace: autoload not armed: {_e!r}\n")
