"""The documentation site as a reader meets it: built by ``make docs`` (which executes
every tutorial), then opened in headless Chromium. CI builds the site first and sets
AUTOSEARCH_REQUIRE_DOCS, so these run there; elsewhere they skip until the site is built."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

SITE = Path(__file__).resolve().parents[1] / "docs" / "_build" / "html"
SHOTS = SITE.parent / "screenshots"


@pytest.fixture(scope="module")
def site() -> Path:
    if not (SITE / "index.html").is_file():
        if os.environ.get("AUTOSEARCH_REQUIRE_DOCS"):
            pytest.fail(f"no site at {SITE}: run `make docs` before the tests")
        pytest.skip("the documentation site is not built (make docs)")
    return SITE


@pytest.fixture(scope="module")
def chromium() -> str:
    found = next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
    )
    if found is None:
        if os.environ.get("AUTOSEARCH_REQUIRE_BROWSER"):
            pytest.fail("Chromium is required here (.ci/run installs Debian's chromium)")
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    return found


def _browser(chromium: str, *args: str) -> str:
    return subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=15000",
            "--window-size=1280,2400",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id":
                self.ids.add(value)
            elif (tag, name) in {
                ("a", "href"),
                ("link", "href"),
                ("script", "src"),
                ("img", "src"),
            }:
                self.links.append(value)


def _parse(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def test_every_page_links_only_to_pages_and_anchors_that_exist(site):
    pages = {p: _parse(p) for p in site.rglob("*.html")}
    assert len(pages) >= 25, sorted(str(p.relative_to(site)) for p in pages)
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//") or link.startswith("mailto:"):
                continue  # external: not this site's to keep
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if not target.exists():
                broken.append(f"{page.relative_to(site)} -> {link} (no such file)")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{page.relative_to(site)} -> {link} (no such anchor)")
    assert not broken, "\n".join(broken[:30])


def test_every_tutorial_executed_and_the_api_reference_is_there(site):
    tutorials = sorted((site / "tutorials").glob("plot_*.html"))
    sources = sorted((SITE.parents[1] / "gallery").glob("plot_*.py"))
    assert [p.stem for p in tutorials] == [p.stem for p in sources] and len(sources) >= 11
    for page in tutorials:
        html = page.read_text(encoding="utf-8")
        assert "sphx-glr-script-out" in html, f"{page.name} shows no executed output"
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    for name in (
        "autosearch.create_study",
        "autosearch.Study.optimize",
        "controllers.RegularizedEvolution",
        "search_spaces.ResNetSpace",
    ):
        assert f'id="{name}"' in api, name
    cli = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    assert "autosearch confirm" in cli and "usage: autosearch run" in cli


def test_the_search_box_finds_a_public_function(site, chromium):
    dom = _browser(chromium, "--dump-dom", (site / "search.html").as_uri() + "?q=create_study")
    hits = re.findall(r'href="([^"]*reference/api\.html#autosearch\.create_study)"', dom)
    assert hits, "searching create_study does not list autosearch.create_study"


def test_a_tutorial_shows_its_output_and_an_interactive_plotly_figure(site, chromium):
    page = (site / "tutorials" / "plot_01_first_study.html").as_uri()
    dom = _browser(chromium, "--dump-dom", page)
    assert "best under 2 MFLOPs" in dom  # what the tutorial printed when the site was built
    # plotly.js (served from _static, no network) drew the figure: its classes and SVG.
    assert "js-plotly-plot" in dom and 'class="main-svg"' in dom
    assert 'class="point"' in dom  # the study's trials, drawn as points
    SHOTS.mkdir(parents=True, exist_ok=True)
    for name, url in (
        ("tutorial.png", page),
        ("search.png", (site / "search.html").as_uri() + "?q=create_study"),
        ("api.png", (site / "reference" / "api.html").as_uri()),
    ):
        _browser(chromium, f"--screenshot={SHOTS / name}", url)
        assert (SHOTS / name).stat().st_size > 10_000, name
