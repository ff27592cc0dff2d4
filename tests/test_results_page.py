"""The results page is generated: ``benchmarks/RESULTS.md`` and its figures are what
``benchmarks/report.py`` writes from the committed JSON, in the page's one form, and
every command it names exists with the flags it gives."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "benchmarks" / "RESULTS.md"
# Words of a development log, not of results: the tracker and the machines' loans are
# not in the repository, and a page of answers says what holds now.
LOG_WORDS = re.compile(
    r"\bsittings?\b|\blent\b|\bnot drawn\b|\bissues? #?\d+|\(#\d+\)", re.IGNORECASE
)


def load_report():
    # By its path: benchmarks/ is not a package and must not shadow one on sys.path.
    spec = importlib.util.spec_from_file_location(
        "autosearch_results_report", ROOT / "benchmarks" / "report.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report():
    module = load_report()
    yield module
    sys.modules.pop("autosearch_results_report", None)


def test_the_committed_page_and_figures_are_a_fresh_generation(report):
    generated = report.generate()
    assert PAGE in generated and any(p.suffix == ".svg" for p in generated)
    stale = [
        p.relative_to(ROOT)
        for p, data in generated.items()
        if not p.exists() or p.read_bytes() != data
    ]
    assert not stale, f"stale: {stale}; run python benchmarks/report.py and commit what it writes"
    assert report.main(["--check"]) == 0


def test_the_page_is_a_headline_table_then_one_section_per_question_in_one_form(report):
    text = PAGE.read_text()
    assert len(text.splitlines()) <= 400
    sections = [q() for q in report.QUESTIONS]
    first_table = text.index("| question | answer |")
    assert first_table < text.index("\n## ")  # the headline table comes first
    for section in sections:
        assert f"[{section.question}](#{section.anchor})" in text[: text.index("\n## ")]
    bodies = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    assert [b.splitlines()[0] for b in bodies] == [s.question for s in sections]
    for body in bodies:
        for part in ("**Answer.**", "- **Protocol.**", "- **Limits.**", "- **Reproduce.**"):
            assert body.count(part) == 1, (body.splitlines()[0], part)
        assert "JSON: `benchmarks/" in body
    for figure in re.findall(r"\]\((figures/[^)]+)\)", text):
        assert (PAGE.parent / figure).is_file()


def test_the_anchors_are_those_github_and_myst_give_the_headings(report):
    section = report.Section(
        slug="x",
        question="Does multi-trial search find NAS-Bench-201's best cell?",
        headline="",
        answer="",
        protocol="",
        limits="",
        commands=[],
        sources=[],
    )
    assert section.anchor == "does-multi-trial-search-find-nas-bench-201s-best-cell"


def test_every_command_and_json_the_page_names_exists(report):
    for section in (q() for q in report.QUESTIONS):
        for source in section.sources:
            assert (ROOT / "benchmarks" / source).exists(), (section.slug, source)
        for command in section.commands:
            runner, script, *args = command.split()
            assert runner in ("python", "bash"), command
            source = (ROOT / script).read_text()
            for flag in (a for a in args if a.startswith("--")):
                assert flag in source, f"{script} has no {flag} (named on the results page)"


def test_a_new_run_changes_the_page(report, monkeypatch):
    """The figures come from the JSON: a run that found the optimum in every seed says so."""
    real = report.load

    def load(path: str) -> dict:
        data = real(path)
        if path == report.WARMUP:
            data = json.loads(json.dumps(data))
            data["single"]["evolution"]["found_best"]["100"] = 1.0
        return data

    monkeypatch.setattr(report, "load", load)
    assert "in 100 % of 50 seeds within 100 evaluations" in report.nb201_search().headline
    assert "in 100 % of 50 seeds" in report.page([report.nb201_search()])


def test_a_transcribed_table_that_changed_shape_is_refused(report, monkeypatch):
    monkeypatch.setattr(
        report, "load", lambda path: {"tables": [{"columns": ["other"], "rows": []}]}
    )
    with pytest.raises(SystemExit, match="update benchmarks/report.py"):
        report.Transcribed("variants").table(0, "network")


def test_results_readme_and_docs_hold_no_development_log_words():
    pages = [ROOT / "README.md", PAGE, *sorted((ROOT / "docs").rglob("*.md"))]
    pages += sorted((ROOT / "docs" / "gallery").glob("*.py"))
    found = [
        f"{page.relative_to(ROOT)}:{i}: {line.strip()}"
        for page in pages
        if "_build" not in page.parts
        for i, line in enumerate(page.read_text().splitlines(), 1)
        if LOG_WORDS.search(line)
    ]
    assert not found, "\n".join(found)
