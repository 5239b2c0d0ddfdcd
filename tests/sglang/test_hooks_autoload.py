"""Activation without code changes: KVTRACE_DIR + the .pth autoload, and ``kvtrace launch``.

Real subprocesses: each imports sglang (through the CPU bootstrap, as a CPU-only server would
need) and builds a real allocator; the hooks arm themselves, each process records its own rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.sglang.hooks_util import ledger
from tracer.sglang.activation import autoload

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for a server's scheduler: imports real sglang, builds a pool, allocates; optionally
# spawns more such processes (spawn start method, as sglang's launcher does).
SERVER = textwrap.dedent('''
    import multiprocessing as mp, sys

    def scheduler(n_tokens):
        from replay.backends.sglang.env import bootstrap
        bootstrap()
        import torch
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        kv = MHATokenToKVPool(size=256, page_size=16, dtype=torch.float16, head_num=1,
                              head_dim=1, layer_num=1, device="cpu", enable_memory_saver=False)
        a = PagedTokenToKVPoolAllocator(256, 16, torch.float16, "cpu", kv, False)
        x = a.alloc(n_tokens)
        a.free(x[:16])

    if __name__ == "__main__":
        n_children = int(sys.argv[1])
        if n_children == 0:
            scheduler(64)
        else:
            mp.set_start_method("spawn")
            ps = [mp.Process(target=scheduler, args=(32 * (i + 1),)) for i in range(n_children)]
            [p.start() for p in ps]
            [p.join() for p in ps]
        sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
''')


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTRACE_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def test_pth_arms_only_with_kvtrace_dir_and_records_the_process(tmp_path):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    pth = autoload.install_pth(site_dir)
    assert pth.read_text() == autoload.pth_line() and autoload.pth_status(site_dir)["current"]
    (tmp_path / "server.py").write_text(SERVER)
    prog = (f"import site, sys; site.addsitedir({str(site_dir)!r}); "
            f"sys.argv = ['server.py', '0']; import runpy; "
            f"runpy.run_path({str(tmp_path / 'server.py')!r}, run_name='__main__')")
    probe = (f"import site, sys; site.addsitedir({str(site_dir)!r}); "
             "print('_kvtrace_autoload_watcher' in sys.modules)")
    # Without KVTRACE_DIR: nothing is armed, nothing is written.
    out = subprocess.run([sys.executable, "-c", probe], env=_env(), capture_output=True, text=True)
    assert out.stdout.strip() == "False"
    trace = tmp_path / "trace"
    out = subprocess.run([sys.executable, "-c", prog], env=_env(KVTRACE_DIR=str(trace)),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    manifest = json.loads((trace / "manifest.json").read_text())
    assert manifest["producer"]["source"] == "sglang-hooks" and manifest["ranks"] == [0]
    assert manifest["server"]["full_pool_tokens"] == 256 and manifest["server"]["page_size"] == 16
    assert ledger(trace) == {"full": 48}
    assert autoload.uninstall_pth(site_dir) and not pth.exists()


def test_launch_records_each_spawned_process_and_returns_its_exit_code(tmp_path):
    (tmp_path / "server.py").write_text(SERVER)
    trace = tmp_path / "trace"
    cmd = [sys.executable, "-m", "replay.cli", "launch", "--out", str(trace), "--",
           sys.executable, str(tmp_path / "server.py"), "2", "3", "--page-size", "16",
           "--swa-full-tokens-ratio", "0.1", "--chunked-prefill-size=2048"]
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 3, out.stderr[-2000:]
    m = json.loads((trace / "manifest.json").read_text())
    assert sorted(m["ranks"]) == [0, 1]
    assert m["launch"]["exit_code"] == 3 and m["launch"]["argv"][1].endswith("server.py")
    srv = m["server"]
    assert srv["swa_full_tokens_ratio"] == 0.1 and srv["chunked_prefill_size"] == 2048
    assert srv["full_pool_tokens"] == 256 and srv["sglang_version"] == "0.5.23"
    assert sorted([ledger(trace, 0)["full"], ledger(trace, 1)["full"]]) == [16, 48]


def test_launch_forwards_signals(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(textwrap.dedent('''
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
        print("ready", os.environ["KVTRACE_DIR"], flush=True)
        time.sleep(60)
    '''))
    cmd = [sys.executable, "-m", "replay.cli", "launch", "--out", str(tmp_path / "t"), "--",
           sys.executable, str(script)]
    p = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline().startswith("ready")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 7


def test_launch_refuses_a_non_empty_out(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "x").write_text("")
    from click.testing import CliRunner

    from replay.cli import main

    res = CliRunner().invoke(main, ["launch", "--out", str(tmp_path / "t"), "--", "true"])
    assert res.exit_code != 0 and "--force" in res.output


def test_live_capture_drains_in_a_separate_process_by_default(monkeypatch, caplog):
    """KVTRACE_FLUSHER: the drain process by default (no GIL handoff to a flusher thread while the
    scheduler steps), ``thread`` on request; anything else is logged and falls back to it."""
    monkeypatch.delenv("KVTRACE_FLUSHER", raising=False)
    assert autoload._flusher() == "process"
    monkeypatch.setenv("KVTRACE_FLUSHER", " Thread ")
    assert autoload._flusher() == "thread"
    monkeypatch.setenv("KVTRACE_FLUSHER", "bogus")
    with caplog.at_level("ERROR", logger="kvtrace.sglang"):
        assert autoload._flusher() == "process"
    assert "KVTRACE_FLUSHER='bogus'" in caplog.text
