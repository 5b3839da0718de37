"""What the browser tests of the report share: where Chromium lays out its parts."""

import html as html_lib
import json
import re
import subprocess
from pathlib import Path

from scalelab.harness.screenshot import chromium

_MEASURE = """<!DOCTYPE html><html><head><title>measuring</title></head><body>
<iframe id="r" src="REPORT" style="width:WIDTHpx;height:900px;border:0"></iframe>
<script>
document.getElementById('r').addEventListener('load', function () {
  var d = this.contentDocument, w = this.contentWindow, out = {};
  function top(id) { var e = d.getElementById(id); return e ? Math.round(e.getBoundingClientRect().top) : null; }
  out.best = top('best'); out.best_table = top('best-table'); out.warnings = top('warnings'); out.figures = top('figures');
  var runs = d.getElementById('run-table');
  out.run_table = [runs.scrollWidth, runs.clientWidth, runs.scrollHeight, runs.clientHeight];
  var box = runs.getBoundingClientRect();
  out.run_columns = Array.from(runs.querySelectorAll('thead th')).map(function (th) {
    var r = th.getBoundingClientRect(); return [th.textContent, r.right <= box.left + runs.clientWidth + 1]; });
  var trained = d.getElementById('trained');
  out.trained = trained ? [top('trained'), trained.textContent] : null;
  out.page = [d.documentElement.scrollWidth, w.innerWidth];
  out.first_h2 = d.querySelector('h2').textContent;
  out.best_rows = Array.from(d.querySelectorAll('#best-table tbody tr')).map(function (tr) {
    return Array.from(tr.children).map(function (td) { return td.textContent; }); });
  var pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script></body></html>"""


def _laid_out(report: Path, tmp_path: Path, width: int = 1280) -> dict:
    """Where Chromium lays out the report's parts in a window `width` px wide (a page beside it
    measures it in an iframe and writes the numbers into its DOM, which --dump-dom prints)."""
    page = tmp_path / f"measure{width}.html"
    page.write_text(_MEASURE.replace("REPORT", report.as_uri()).replace("WIDTH", str(width)))
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--allow-file-access-from-files",
           f"--user-data-dir={tmp_path / f'chrome-measure{width}'}", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="measured">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    return json.loads(html_lib.unescape(found.group(1)))
