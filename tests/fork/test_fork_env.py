"""The fork's CPU environment: prepared once and cached, and its modules import at both commits."""

from __future__ import annotations

import time

import pytest

from tests.fork.conftest import COMMITS, fork_tarball


def test_prepare_is_cached_and_fast(fork_codes):
    from replay.codes import prepare

    for commit in COMMITS:
        t0 = time.perf_counter()
        env = prepare(fork_tarball(commit))
        took = time.perf_counter() - t0
        assert env.cached and took < 1.0, (commit, took, env.steps)
        assert (env.python_dir / "sglang" / "__init__.py").is_file()
        assert "transformers==5.6.0" in env.pins and env.overlay_dir is not None
        assert (env.overlay_dir / "transformers" / "__init__.py").is_file()
        assert env.sha == fork_codes[commit].sha
    assert fork_codes["pre659"].sha != fork_codes["post659"].sha
    assert fork_codes["pre659"].overlay_dir == fork_codes["post659"].overlay_dir  # one overlay per pin list


def test_prepare_refuses_what_it_cannot_prepare(tmp_path):
    from replay.codes import CodePrepareError, prepare

    with pytest.raises(CodePrepareError, match="no such file"):
        prepare(tmp_path / "missing.tar.xz")
    with pytest.raises(CodePrepareError, match="without python/sglang"):
        prepare(tmp_path)
    with pytest.raises(CodePrepareError, match="expected sglang==VERSION"):
        prepare("sglang==banana")  # (real releases: tests/codes/test_pypi_spec.py)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("commit", COMMITS)
def test_fork_modules_import_in_their_own_process(fork_codes, commit):
    from replay.codes import call_in_code

    env = fork_codes[commit]
    run = call_in_code(env, "replay.codes.probe:imports", timeout_s=540)
    assert run.result["failed"] == {}
    assert run.result["sglang_file"].startswith(str(env.python_dir))
    boot = run.bootstrap
    assert set(boot["stubbed"]) == {"triton", "torchvision", "sgl_kernel"}
    assert "sglang.srt.mem_cache.allocator:alloc_decode_kernel" in boot["fallbacks"]
    assert any("DeepSeekV4PagedHostPool.backup_from_device_all_layer" in n for n in boot["noops"])


def test_a_failing_call_reports_the_error_not_a_traceback(fork_codes):
    from replay.codes import CodeCallError, call_in_code

    with pytest.raises(CodeCallError, match="ModuleNotFoundError"):
        call_in_code(fork_codes["post659"], "replay.codes.no_such_module:f", timeout_s=120)
