"""``kvtrace report`` opened in a real headless Chromium (Debian ``chromium``; ``make test`` installs
it with apt when absent and we run as root, and so does the fixture): the page loads with the
network off, logs no console errors, renders its Plotly figures, the DOM (``--dump-dom``) holds
the headline text of an incident report, and the screenshot is not blank (pixel variance).
Where chromium cannot be had (not root, no apt) the tests skip, saying why."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from replay.paths import bundled
from replay.report import build_report
from tests.analysis.conftest import small_rows, write_trace


@pytest.fixture(scope="session")
def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env, capture_output=True)
        exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("Debian chromium is not installed and cannot be installed here (needs root and apt-get): "
                    "apt-get install -y chromium, or `make test` as root (see docs/analysis.md)")
    return exe


def _chrome(exe, tmp_path, *args, height=2400):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9",  # network off
           "--proxy-bypass-list=<-loopback>", "--enable-logging=stderr", "--v=0", "--hide-scrollbars",
           "--virtual-time-budget=15000", f"--window-size=1400,{height}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _not_blank(path):
    from PIL import Image, ImageStat

    img = Image.open(path).convert("L")
    lo, hi = img.getextrema()
    colors = len(img.getcolors(maxcolors=1 << 16) or [])
    var = ImageStat.Stat(img).var[0]
    assert hi - lo > 100 and colors > 20 and var > 100, (lo, hi, colors, var)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_report_renders_offline_without_console_errors(chromium, tmp_path):
    trace = write_trace(tmp_path / "t", small_rows())
    build_report(trace, tmp_path / "report.html", resample="250ms")
    html = (tmp_path / "report.html").read_text()
    assert "<script src=" not in html  # everything inlined
    drawn = html.count('class="fig"')  # figures with data (an all-zero one is a sentence)
    url = (tmp_path / "report.html").as_uri()
    dom = _chrome(chromium, tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = len(re.findall(r'class="[^"]*js-plotly-plot', dom.stdout))
    assert rendered == drawn >= 3
    assert dom.stdout.count('class="main-svg"') >= rendered  # plotly drew each one
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not [ln for ln in console if re.search(r"error|Uncaught", ln, re.I)], console
    shot = tmp_path / "shot.png"
    s = _chrome(chromium, tmp_path, f"--screenshot={shot}", url)
    assert shot.is_file(), s.stderr[-2000:]
    _not_blank(shot)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_incident_report_headline_in_the_dom_and_screenshot(chromium, tmp_path):
    out = tmp_path / "r.html"
    build_report(bundled("incidents/lost_unlock"), out, replay=True)
    url = out.as_uri()
    dom = _chrome(chromium, tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = re.sub(r"<[^>]+>", "", dom.stdout)
    for needle in ("Verdict: growing", "swa pool: growing", "Primary cause:", "Finished requests left their tree "
                   "path locked", "Holders that matter", "Replayed proof", "fix is in the server's code"):
        assert needle in text, needle
    assert len(re.findall(r'class="[^"]*js-plotly-plot', dom.stdout)) >= 4  # proof + evidence figures drawn
    shot = tmp_path / "first_screen.png"
    s = _chrome(chromium, tmp_path, f"--screenshot={shot}", url, height=1000)
    assert shot.is_file(), s.stderr[-2000:]
    _not_blank(shot)
