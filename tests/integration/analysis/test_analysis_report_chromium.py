"""The HTML report opened in a real headless Chromium: the heatmap image decodes and shows."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from PIL import Image

from pdexporter.analysis.job import analyse
from pdexporter.analysis.report import write_report
from pdexporter.analysis.synthetic import SyntheticTruth, seed_grid, synthetic_records
from pdexporter.analysis.table import samples_from_record

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]

# Appended to a COPY of the report (the report itself has no script): after load, write what the
# browser decoded into the DOM so --dump-dom can show it.
PROBE = """<script>
window.addEventListener('load', function () {
  var img = document.getElementById('plot-heatmap_penalty_ratio');
  var all = Array.prototype.slice.call(document.images);
  var out = document.createElement('pre');
  out.id = 'pdx-probe';
  out.textContent = JSON.stringify({found: !!img, complete: img && img.complete,
    width: img ? img.naturalWidth : 0, height: img ? img.naturalHeight : 0,
    images: all.length, decoded: all.filter(function (i) { return i.naturalWidth > 0; }).length,
    banner: !!document.getElementById('modelled-banner')});
  document.body.appendChild(out);
});
</script>"""


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def test_heatmap_renders_in_headless_chromium(tmp_path):
    grid = seed_grid(chunks=(2048, 8192), decodes=(0, 1, 4, 8), prefills=(512, 4096, 32768))
    analysis = analyse([samples_from_record(r) for r in synthetic_records(SyntheticTruth(), grid, reps=2)])
    report = write_report(analysis, tmp_path / "report.html")

    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    done = _chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="pdx-probe">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    probe = json.loads(found.group(1).replace("&quot;", '"'))
    assert probe["found"] and probe["complete"]
    assert probe["width"] > 500 and probe["height"] > 300  # the decoded heatmap PNG
    assert probe["decoded"] == probe["images"] == 3
    assert probe["banner"]

    # And the unmodified report, rendered: the heatmap's colours are on the screen.
    shot = tmp_path / "shot.png"
    done = _chromium(tmp_path, "--window-size=1400,4000", f"--screenshot={shot}", report.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 500  # a page of text alone has far fewer
