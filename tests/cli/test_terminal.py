"""A clean terminal: sglang's log lines and warnings go to OUT/sglang.log, a closed pipe ends
quietly, progress bars only on a terminal; through the installed ``kvtrace`` script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KVTRACE = shutil.which("kvtrace") or str(Path(sys.executable).parent / "kvtrace")
INCIDENT = ROOT / "data" / "incidents" / "lost_free"


def run(*args, **kw):
    return subprocess.run([KVTRACE, *map(str, args)], capture_output=True, text=True, timeout=240, **kw)


@pytest.fixture(scope="module")
def tiny_workload(tmp_path_factory):
    from replay.backends.sglang import write_workload
    from tests.sglang.backend_util import multi_turn_rows

    return write_workload(tmp_path_factory.mktemp("wl") / "w", multi_turn_rows(num_sessions=2, turns=2),
                          hash_block_tokens=16)


@pytest.mark.parametrize("args", [["verify", INCIDENT], ["doctor", INCIDENT, "--json"], ["policies"],
                                  ["workload", "shapes"]], ids=lambda a: a[0])
def test_closed_pipe_ends_quietly(args):
    """The reader is gone before kvtrace writes: no "Broken pipe" message, status 141."""
    p = subprocess.Popen([KVTRACE, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # like `| head -0`: every write gets EPIPE
    err = p.stderr.read().decode()
    rc = p.wait(timeout=120)
    assert err == "" and rc == 141, (rc, err)


def test_verify_into_head_is_quiet():
    """The issue's command verbatim: `kvtrace verify T | head -1`."""
    res = subprocess.run(["bash", "-c", f"'{KVTRACE}' verify '{INCIDENT}' | head -1"], capture_output=True,
                         text=True, timeout=120)
    assert res.stdout.startswith("trace      ") and res.stderr == "", res.stderr


def test_compact_draws_no_bar_into_a_log(tmp_path):
    src = ROOT / "data" / "incidents" / "healthy_chat"
    res = run("compact", src, "--out", tmp_path / "c")
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr  # stderr is a file here: no bar, no \r
    # --force replaces the copy (a kvtrace trace); a non-kvtrace directory is refused, not deleted
    assert run("compact", src, "--out", tmp_path / "c").returncode == 2
    assert run("compact", src, "--out", tmp_path / "c", "--force").returncode == 0
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "mine.txt").write_text("keep")
    res = run("compact", src, "--out", tmp_path / "junk", "--force")
    assert res.returncode == 2 and res.stderr.startswith("kvtrace: error: ")
    assert (tmp_path / "junk" / "mine.txt").read_text() == "keep"


@pytest.mark.slow
@pytest.mark.sglang
@pytest.mark.timeout(400)
def test_record_and_replay_keep_sglang_off_the_terminal(tiny_workload, tmp_path):
    """The real sglang backend logs ~20 lines and warnings at start-up: none reaches stderr; they
    are in OUT/sglang.log, named in the closing line. --verbose lets them through."""
    out = tmp_path / "t"
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    res = run("record", "--workload", tiny_workload, "--out", out, env=dict(os.environ, TMPDIR=str(tmpdir)))
    assert res.returncode == 0, res.stderr
    # nothing left in the temporary directory: the captured log moved into OUT, the Scheduler's
    # ipc:// files (sglang's PortArgs makes them with NamedTemporaryFile(delete=False)) removed;
    # torch's compile cache (one per user, reused) is torch's own
    assert [p.name for p in tmpdir.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert res.stderr == "", res.stderr
    log = (out / "sglang.log").read_text()
    assert "Warning" in log and "KV Cache is allocated" in log, log[:2000]
    assert f"sglang's log: {out / 'sglang.log'}" in res.stdout
    res = run("replay", out, "--policy", "swa-fixes", "--out", tmp_path / "r", "--verbose")
    assert res.returncode == 0
    assert "KV Cache is allocated" in res.stderr  # --verbose: shown, no log file
    assert not (tmp_path / "r" / "sglang.log").exists()
    assert "wall in all, start-up included" in res.stdout
    assert run("replay", out, "--out", tmp_path / "r").returncode == 2  # exists; --force replaces it
    res = run("replay", out, "--out", tmp_path / "r", "--force", "--json")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert (tmp_path / "r" / "sglang.log").is_file()
