"""The CPU bootstrap of real sglang: version gate, import stubs, host-copy no-ops."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

os.environ.setdefault("SGLANG_DEBUG_MEMORY_POOL", "1")

from replay.backends.sglang import env as sglang_env  # noqa: E402

pytestmark = pytest.mark.sglang


def test_refuses_other_versions_naming_supported_ones():
    with pytest.raises(sglang_env.UnsupportedSglangVersion) as exc:
        sglang_env.check_sglang_version("0.5.22")
    msg = str(exc.value)
    assert "0.5.22" in msg and "0.5.23" in msg
    assert sglang_env.check_sglang_version("0.5.23") == "0.5.23"


def test_installed_version_is_supported():
    # Fails (never skips) when sglang is missing: SglangNotInstalled is raised.
    assert sglang_env.installed_sglang_version() in sglang_env.SUPPORTED_SGLANG_VERSIONS


def test_bootstrap_imports_real_sglang_and_applies_noops():
    info = sglang_env.bootstrap()
    assert info.sglang_version == "0.5.23"
    import importlib

    from sglang.srt.mem_cache.pool_host import common, mha
    importlib.import_module("sglang.srt.mem_cache.unified_radix_cache").UnifiedRadixCache  # probe: it imports

    assert common._cuda_host_register is sglang_env._noop
    assert mha.MHATokenToKVPoolHost.backup_from_device_all_layer is sglang_env._noop
    assert len(info.noops) == len(sglang_env.HOST_COPY_NOOPS)
    # stubs only for packages that are absent
    for name in info.stubbed:
        assert getattr(sys.modules[name], "__kvtrace_stub__", False)
    assert sglang_env.bootstrap().noops == info.noops  # idempotent


def test_uninstall_noops_restores_originals():
    sglang_env.bootstrap()
    from sglang.srt.mem_cache.pool_host import mha

    sglang_env.uninstall_host_copy_noops()
    try:
        assert mha.MHATokenToKVPoolHost.backup_from_device_all_layer is not sglang_env._noop
    finally:
        sglang_env.install_host_copy_noops()
    assert mha.MHATokenToKVPoolHost.backup_from_device_all_layer is sglang_env._noop


def test_stub_shapes():
    """The catch-all answers the usage shapes sglang makes at import time."""
    code = (
        "import sys; from replay.backends.sglang.env import install_import_stubs as i;"
        "r = i(); assert 'triton' in r, r\n"
        "import triton, triton.language as tl\n"
        "from triton.runtime.autotuner import OutOfResources, Autotuner\n"
        "from torchvision.transforms import InterpolationMode\n"
        "@triton.jit\ndef k(x, B: tl.constexpr): return x\n"
        "assert k(3, 1) == 3\n"
        "@triton.autotune(configs=[triton.Config({})], key=['n'])\ndef k2(): return 5\n"
        "assert k2() == 5 and triton.cdiv(7, 2) == 4 and triton.next_power_of_2(5) == 8\n"
        "assert issubclass(OutOfResources, Exception)\nclass A(Autotuner): pass\n"
        "assert InterpolationMode.BICUBIC is not None\n"
        "import torchvision; assert torchvision.__version__ == '0.28.0'\n"
        "print('ok')\n"
    )
    # fresh interpreter so the real import machinery state is untouched
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_no_stub_for_an_installed_package(tmp_path):
    """A package that is really installed is never shadowed by a stub."""
    pkg = tmp_path / "torchvision"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = 'real'\n")
    code = ("from replay.backends.sglang.env import install_import_stubs as i\n"
            "r = i(); assert r == ('triton',), r\n"
            "import torchvision; assert torchvision.__version__ == 'real'\n"
            "assert not hasattr(torchvision, '__kvtrace_stub__')\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.getcwd()]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
