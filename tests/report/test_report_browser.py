"""``kvtrace report`` opened in a real headless Chromium (Debian ``chromium``; the session fixture
installs it with apt when absent and we run as root): the page loads with the network off, logs no
console errors, renders the expected number of Plotly figures, and the screenshot is not blank."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from replay.report import build_report
from tests.analysis.conftest import small_rows, write_trace


@pytest.fixture(scope="session")
def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env, capture_output=True)
        exe = shutil.which("chromium")
    assert exe, "Debian chromium is needed: apt-get install -y chromium (as root), see docs/analysis.md"
    return exe


def _chrome(exe, tmp_path, *args):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9",  # network off
           "--proxy-bypass-list=<-loopback>", "--enable-logging=stderr", "--v=0",
           "--virtual-time-budget=15000", "--window-size=1400,2400", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_report_renders_offline_without_console_errors(chromium, tmp_path):
    from PIL import Image

    trace = write_trace(tmp_path / "t", small_rows())
    res = build_report(trace, tmp_path / "report.html", resample="250ms")
    html = (tmp_path / "report.html").read_text()
    assert "<script src=" not in html  # everything inlined
    url = (tmp_path / "report.html").as_uri()
    dom = _chrome(chromium, tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = len(re.findall(r'class="[^"]*js-plotly-plot', dom.stdout))
    assert rendered == len(res["figures"]) == 4
    assert dom.stdout.count('class="main-svg"') >= rendered  # plotly drew each one
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not [ln for ln in console if re.search(r"error|Uncaught", ln, re.I)], console
    shot = tmp_path / "shot.png"
    s = _chrome(chromium, tmp_path, f"--screenshot={shot}", url)
    assert shot.is_file(), s.stderr[-2000:]
    img = Image.open(shot).convert("L")
    lo, hi = img.getextrema()
    colors = len(img.getcolors(maxcolors=1 << 16) or [])
    assert hi - lo > 100 and colors > 20, (lo, hi, colors)
