"""The quality report as a person sees it: a real report, opened in headless Chromium.

The browser is the pinned one `make chromium` (scripts/fetch_chromium.py) puts in .chromium/; the test fetches
it when it is missing and is skipped, saying why, only when that cannot be done (no network, another
platform). `QUALITY_REPORT_SCREENSHOT=docs/img/quality-report.png` also saves the screenshot there (the one
docs/quality.md shows).
"""

import io
import os
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.storage import DatasetRef
from pipeline.quality.report import run
from scripts.fetch_chromium import ChromiumUnavailable, environment, fetch
from tests.headless_chromium import HeadlessChromium

pytestmark = pytest.mark.slow
HEADINGS = (
    "Subjects",
    "Diversity",
    "Drop funnel",
    "Across snapshots",
    "Metrics",
)  # the sections every report has, whatever else it grows


@pytest.fixture(scope="module")
def chromium() -> Path:
    try:
        return fetch()
    except ChromiumUnavailable as error:
        pytest.skip(f"no headless Chromium: {error}")


@pytest.fixture(scope="module")
def report(chromium, sample_corpus) -> Path:
    """The quality stage's report on the sample crawl's clean documents (its own output snapshot)."""
    config, snapshot = sample_corpus
    output = DatasetRef.of(config, "quality", "sample-site")
    run(config, [DatasetRef.of(config, "clean", snapshot)], output)
    return output.path / "report.html"


def test_the_report_renders_with_every_plot_loaded(chromium, report, tmp_path):
    from PIL import Image

    with HeadlessChromium(chromium, environment(chromium)) as browser:
        page = browser.open(report.as_uri())
        images = page.evaluate(
            "[...document.images].map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth,"
            " height: i.naturalHeight, shown: i.getBoundingClientRect().width}))"
        )
        headings = page.evaluate("[...document.querySelectorAll('h1, h2')].map(h => h.innerText)")
        text = page.evaluate("document.body.innerText")
        png = page.screenshot()

    source = report.read_text()
    assert len(images) == source.count("<img") > 0
    broken = [image["alt"] for image in images if not (image["complete"] and image["width"] > 0)]
    assert broken == [], f"images that did not load: {broken}"
    assert all(image["height"] > 0 and image["shown"] > 0 for image in images), images
    assert headings[0].startswith("Data quality report"), headings
    assert set(HEADINGS) <= set(headings), headings
    assert len(text) > 200

    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "report.png").write_bytes(png)
    if os.environ.get("QUALITY_REPORT_SCREENSHOT"):
        Path(os.environ["QUALITY_REPORT_SCREENSHOT"]).write_bytes(png)
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    height, width, _ = pixels.shape
    assert width >= 1000 and height > 900, "the whole page, not only the window"  # 1280-pixel window
    grey = pixels.mean(axis=2)
    assert grey.std() > 10, "a blank page"
    assert (grey < 250).mean() > 0.05, "almost nothing drawn"
    colours = np.unique(pixels.reshape(-1, 3), axis=0)
    assert len(colours) > 100, "plots are drawn in many colours, text alone in few"
