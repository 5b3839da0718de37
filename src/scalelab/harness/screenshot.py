"""The README's picture of a report, made by a command so that it can be current:

    python -m scalelab.harness.screenshot results            -> docs/img/report.png
    python -m scalelab.harness.screenshot RESULTS --out PATH

Headless Chromium (`make browser`) draws RESULTS/report/report.html at 1280 pixels wide; the PNG
carries, as text chunks, what it shows (the tables' schema version, the runs, the sweep's points,
the date), which tests/unit/test_docs.py holds against the code and docs/measured.json.
"""
from __future__ import annotations

import argparse
import datetime
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from scalelab.harness import REPO_ROOT

DEFAULT_OUT = REPO_ROOT / "docs" / "img" / "report.png"
WIDTH, HEIGHT = 1280, 2200


def chromium() -> str | None:
    """The headless browser's path (Debian's chromium, or another Chromium build), or None."""
    return next((path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None)


def screenshot(html: Path, out: Path, width: int = WIDTH, height: int = HEIGHT, timeout_s: float = 120) -> str:
    """Draw html into out (PNG); Chromium's log. Raises RuntimeError when no picture came."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("no Chromium on this machine: `make browser` installs Debian's")
    with tempfile.TemporaryDirectory(prefix="scalelab-chromium-") as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic", "--hide-scrollbars",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", f"--window-size={width},{height}",
               f"--screenshot={out}", Path(html).resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if not out.exists() or out.stat().st_size < 10_000:
        raise RuntimeError(f"Chromium drew no picture of {html}: {proc.stderr[-2000:]}")
    return proc.stderr


def stamp(results: Path) -> dict[str, str]:
    """What a picture of this results folder's report shows, as PNG text chunks."""
    import pandas as pd

    from scalelab.planning.result_tables import schema_version

    runs = pd.read_parquet(results / "metrics.parquet")
    return {"scalelab-schema": str(schema_version(results / "metrics.parquet")), "scalelab-runs": str(len(runs)),
            "scalelab-ok-runs": str(int((runs["status"] == "ok").sum())),
            "scalelab-made": datetime.date.today().isoformat()}


def read_stamp(png: Path) -> dict[str, str]:
    from PIL import Image

    with Image.open(png) as image:
        return {k: v for k, v in image.text.items() if k.startswith("scalelab-")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalelab.harness.screenshot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a results folder with report/report.html and metrics.parquet")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--height", type=int, default=HEIGHT, help="pixels of the page drawn (from its top)")
    args = parser.parse_args(argv)
    html = args.results / "report" / "report.html"
    if not html.exists():
        print(f"error: no report at {html} (snakemake builds it; scalelab report {args.results} rebuilds it)", file=sys.stderr)
        return 2
    from PIL import Image, PngImagePlugin

    raw = args.out.with_suffix(".raw.png")
    try:
        screenshot(html, raw, height=args.height)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    info = PngImagePlugin.PngInfo()
    for key, value in stamp(args.results).items():
        info.add_text(key, value)
    with Image.open(raw) as image:
        image.save(args.out, pnginfo=info, optimize=True)
    raw.unlink()
    print(f"{args.out}: {', '.join(f'{k}={v}' for k, v in read_stamp(args.out).items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
