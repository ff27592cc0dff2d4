"""Sphinx configuration: the autosearch documentation site.

Sphinx with sphinx-gallery (tutorials executed at every build), the furo theme, MyST
for the Markdown guide pages, and autodoc + napoleon for the API reference from the
docstrings. Built by ``make docs`` into ``docs/_build/html``, which opens offline:
plotly.js is served from ``_static``, never from a CDN.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import plotly
import plotly.io as pio
from plotly.io.base_renderers import HtmlRenderer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AUTOSEARCH_CACHE", str(HERE / "_build" / "cache"))

import autosearch  # noqa: E402

project = "autosearch"
author = "the autosearch developers"
copyright = "2026, the autosearch developers"
release = version = autosearch.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "gallery/README.txt", "**/*.ipynb", "**/*.py.md5", "**/*.zip"]
# myst.header: the guide pages start at any heading level; config.cache: the gallery's
# configuration holds a function, so Sphinx rebuilds every page when it changes.
suppress_warnings = ["myst.header", "config.cache"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"autosearch {release}"
html_static_path = ["_static"]
html_js_files = ["plotly.min.js"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
nitpicky = False

# --- plotly, offline -----------------------------------------------------------------
# The tutorials' figures are embedded as HTML that calls the plotly.js served from
# _static (copied from the installed plotly package).
(HERE / "_static").mkdir(exist_ok=True)
shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", HERE / "_static")


class _Docs(HtmlRenderer):
    """A figure as a <div> and the script that draws it with the page's plotly.js."""

    def __init__(self) -> None:
        super().__init__(connected=False, full_html=False, global_init=False)

    def to_mimebundle(self, fig_dict):
        html = pio.to_html(fig_dict, include_plotlyjs=False, full_html=False, validate=False)
        # The theme loads plotly.js at the end of the page: draw once the page is read.
        html, scripts = re.subn(
            r"<script[^>]*>(.*?)</script>",
            r"<script>"
            r'document.addEventListener("DOMContentLoaded", function () {\1});</script>',
            html,
            flags=re.DOTALL,
        )
        if scripts != 1:
            raise RuntimeError(f"plotly's HTML has {scripts} scripts, not one: update docs/conf.py")
        return {"text/html": html}


pio.renderers["autosearch_docs"] = _Docs()
pio.renderers.default = "autosearch_docs"


def _reset_plotly(gallery_conf, fname):
    """Before each tutorial: figures through the offline renderer, and the ONNX
    exporter's step-by-step log kept out of the page."""
    pio.renderers.default = "autosearch_docs"
    for name in ("onnx_ir", "onnxscript", "torch.onnx"):
        logging.getLogger(name).setLevel(logging.WARNING)


sphinx_gallery_conf = {
    "examples_dirs": ["gallery"],
    "gallery_dirs": ["tutorials"],
    "filename_pattern": r"/plot_",
    "capture_repr": ("_repr_html_", "__repr__"),
    "image_scrapers": (),
    "reset_modules": (_reset_plotly,),
    "abort_on_example_error": True,  # a tutorial that raises fails the build, by name
    "only_warn_on_example_error": False,
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "show_memory": False,
    "plot_gallery": "True",
}

# --- the CLI reference, from each verb's --help ------------------------------------------


def _help(*verb: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "autosearch.cli", *verb, "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "88"},
    ).stdout
    return out.rstrip()


def _write_cli_reference() -> None:
    top = _help()
    verbs = re.search(r"\{([a-z,-]+)\}", top)
    assert verbs, "autosearch --help lists no verbs"
    parts = [
        "# Command-line reference",
        "",
        "Generated from `autosearch --help` and each verb's `--help` when the site is built.",
        "The [command-line guide](../guide/command-line.md) says what each does, with examples.",
        "",
        "```text",
        top,
        "```",
    ]
    for verb in verbs.group(1).split(","):
        parts += ["", f"## autosearch {verb}", "", "```text", _help(verb), "```"]
    target = HERE / "reference" / "cli.md"
    text = "\n".join(parts) + "\n"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


_write_cli_reference()
