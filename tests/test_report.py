"""The HTML report: self-contained, escaped, and drawn for real in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from autosearch import Compression, TrainConfig
from autosearch.report import write_report


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report of a 4-trial study with int8 variants, and the study."""
    import autosearch
    from controllers import RandomSearch
    from search_spaces import ResNetSpace

    folder = tmp_path_factory.mktemp("report")
    space = ResNetSpace(
        min_stages=2, max_stages=2, depths=(1, 2), widths=(4, 8), stem_widths=(4, 8)
    )
    study = autosearch.create_study(
        "<script>alert('x')</script>",
        controller=RandomSearch(space, seed=0),
        storage=f"sqlite:///{folder}/s.db",
        train=TrainConfig(epochs=2, batch_size=128, lr=0.1),
        variants=("base", "int8"),
        compression=Compression(finetune_epochs=1, only_front=True),
    )
    study.optimize(4)
    return write_report(study, folder / "report.html"), study


def test_the_report_is_one_offline_file_with_every_section(report):
    path, study = report
    text = path.read_text()
    assert text.count("* plotly.js v") == 1  # plotly.js inlined, once
    assert not re.search(r"<script[^>]+src=", text)  # nothing fetched from the network
    for section in (
        "Pareto front",
        "Accuracy, FLOPs and latency",
        "Search history",
        "Hypervolume",
        "Learning curves",
        "Gene importance",
        "Top architectures",
        "Data cleaning",
    ):
        assert f"<h2>{section}" in text, section
    assert text.count("Plotly.newPlot") == 6
    # Every user-supplied string is escaped: the study's name cannot inject a script.
    assert "<script>alert" not in text and "&lt;script&gt;alert" in text
    for record in study.records(variants=False):
        assert record.description in text


def _chromium() -> str | None:
    return next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
        None,
    )


@pytest.mark.slow
def test_the_report_draws_its_plots_in_headless_chromium(report, tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("AUTOSEARCH_REQUIRE_BROWSER"):
            pytest.fail("Chromium is required here (.ci/run installs Debian's chromium)")
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    path, study = report
    common = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--virtual-time-budget=15000",
        "--window-size=1280,6000",
    ]
    shot = tmp_path / "report.png"  # one browser run: the page's DOM and its picture
    dom = subprocess.run(
        [*common, "--dump-dom", f"--screenshot={shot}", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    ).stdout
    # Plotly drew every figure (an SVG root per plot) and a marker per 2-D point.
    assert dom.count('class="plot-container plotly"') == 6
    points = len([r for r in study.records() if r.state == "complete"])
    assert dom.count('class="point"') >= points

    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    # The front and best-so-far lines are #d1495b; the hypervolume line #00798c.
    red = (np.abs(pixels - (0xD1, 0x49, 0x5B)).sum(axis=2) < 40).sum()
    teal = (np.abs(pixels - (0x00, 0x79, 0x8C)).sum(axis=2) < 40).sum()
    assert red > 300 and teal > 300, (red, teal)
