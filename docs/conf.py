"""Sphinx configuration of pytest-san's documentation (``sphinx-build -W --keep-going docs docs/_build/html``).

The pages are MyST Markdown; CONTRACT.md, CHANGELOG.md and the READMEs that ship in the wheel are included
from where they live, never copied. Nothing is fetched: no intersphinx, no remote images.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "docs" / "_ext")]

import pyverbs_stand_in  # noqa: E402

import pytest_san  # noqa: E402  (the checkout first, so the docs describe the code beside them)

pyverbs_stand_in.install()  # the verbs engine imports pyverbs, which only lab hosts have

project = "pytest-san"
author = "pytest-san developers"
copyright = "2026, pytest-san developers"
release = version = pytest_san.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinxarg.ext", "san_api", "san_options"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 4  # GitHub's heading anchors, which the included READMEs link to (#by-hand)
myst_enable_extensions = ["colon_fence"]
# Every cross-reference must resolve (a broken one is a warning, so an error), except to what lives outside
# these docs: with no intersphinx, the standard library's and pytest's names have no target here.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(collections|contextlib|pathlib|typing|pytest|_pytest)\..*|tuple\[.*"),
                        # pytest_san.batch's ParamSpec: Batch.call's parameters are the called method's
                        (r"py:class", r"P(\.args|\.kwargs)?")]
smartquotes = False  # "--" is an option's prefix here, never a dash

html_theme = "furo"
html_title = f"pytest-san {release}"
html_static_path = ["_static"]
html_css_files = ["san.css"]
