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


# Clicks the penalty_ratio header twice (ascending, then descending) and writes what the table
# showed, its height, and whether anything around it scrolls on its own.
SORT_PROBE = """<script>
window.addEventListener('load', function () {
  var table = document.getElementById('interference-table');
  var heads = Array.prototype.map.call(table.tHead.rows[0].cells, function (th) { return th.textContent; });
  var col = heads.indexOf('penalty_ratio');
  function column() {
    return Array.prototype.map.call(table.tBodies[0].rows, function (r) { return r.cells[col].textContent; });
  }
  var before = column();
  table.tHead.rows[0].cells[col].click();
  var up = column(), upSort = table.tHead.rows[0].cells[col].getAttribute('aria-sort');
  table.tHead.rows[0].cells[col].click();
  var down = column(), downSort = table.tHead.rows[0].cells[col].getAttribute('aria-sort');
  var boxed = false;
  for (var el = table.parentElement; el && el !== document.documentElement; el = el.parentElement) {
    var style = getComputedStyle(el);
    if ((style.overflowY === 'auto' || style.overflowY === 'scroll') && el.scrollHeight > el.clientHeight) boxed = true;
  }
  var rect = document.getElementById('plot-heatmap_penalty_ratio').getBoundingClientRect();
  var out = document.createElement('pre');
  out.id = 'pdx-probe';
  out.textContent = JSON.stringify({col: col, before: before, up: up, down: down, upSort: upSort, downSort: downSort,
    tableHeight: table.getBoundingClientRect().height, rows: table.tBodies[0].rows.length, boxed: boxed,
    heatmap: [rect.left, rect.top + window.scrollY, rect.width, rect.height]});
  document.body.appendChild(out);
});
</script>"""


def _ratio(text: str) -> float:
    return float("inf") if text == "n/a" else float(text)


def test_report_table_sorts_and_is_not_boxed_and_heatmap_reads(tmp_path):
    grid = list(seed_grid(chunks=(2048, 8192), decodes=(0, 1, 4, 12), prefills=(512, 4096, 16384, 32768)))
    analysis = analyse([samples_from_record(r) for r in synthetic_records(SyntheticTruth(), grid, reps=2)])
    report = write_report(analysis, tmp_path / "report.html")
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", SORT_PROBE + "</body>"))
    done = _chromium(tmp_path, "--window-size=1400,1000", "--virtual-time-budget=10000", "--dump-dom",
                     probed.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="pdx-probe">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    probe = json.loads(found.group(1).replace("&quot;", '"'))
    assert probe["col"] == 6 and probe["rows"] == len(grid)
    numbers = [_ratio(t) for t in probe["up"]]
    assert numbers == sorted(numbers) and probe["upSort"] == "ascending"  # n/a (D = 0) last
    shown = [t for t in probe["down"] if t != "n/a"]
    assert [float(t) for t in shown] == sorted((float(t) for t in shown), reverse=True)
    assert probe["down"][len(shown):] == ["n/a"] * (len(grid) - len(shown)) and probe["downSort"] == "descending"
    assert sorted(probe["before"]) == sorted(probe["up"])  # the same cells, reordered
    # full height (every row its own line, the page scrolls), not a 40rem box that scrolls on its own
    assert not probe["boxed"] and probe["tableHeight"] > max(640, 18 * probe["rows"])

    # The screenshot: the heatmap's cells span light to dark (log scale), visible at a glance.
    left, top, width, height = (int(v) for v in probe["heatmap"])
    shot = tmp_path / "shot.png"
    done = _chromium(tmp_path, f"--window-size=1400,{top + height + 50}", f"--screenshot={shot}", report.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    with Image.open(shot) as image:
        region = image.convert("L").crop((left, top, left + width, top + height))
        histogram = region.histogram()
    dark = sum(histogram[:60]) / sum(histogram)
    light = sum(histogram[200:250]) / sum(histogram)
    assert dark > 0.02 and light > 0.05, (dark, light)  # dark cells (high ratios) and light ones (low)
