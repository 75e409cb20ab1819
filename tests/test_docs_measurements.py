"""Measured test counts in the docs carry the date and the commit they were measured at.

A count copied by hand drifts (issue 28: the docs said rxe skips 12 when it skipped 13, siw "141 passed, 13
skipped" when it gave 200 and 14). Every paragraph of README.md and docs/ that gives one ("201 passed",
"13 skipped") must say when (an ISO date) and at which tree (``commit <id>``); a table's counts may be
dated by the paragraph just before it. Counts that change every night belong to nightly's ``matrix.md``.
Fenced code blocks (sample output) are not measurements.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "hil/lab/README.md", *sorted((ROOT / "docs").glob("*.md"))]
COUNT = re.compile(r"\b\d+ (?:passed|skipped)\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
TREE = re.compile(r"\bcommit [0-9a-f]{7,40}\b")


def blocks(text: str) -> list[str]:
    """The page's paragraphs and tables (split at blank lines), fenced code left out; a table joined with
    the paragraph before it (its caption)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith("|") and out:
            out[-1] += "\n" + block
        else:
            out.append(block)
    return out


def unstamped(text: str) -> list[str]:
    return [block for block in blocks(text) if COUNT.search(block) and not (DATE.search(block) and TREE.search(block))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_measured_count_says_when_and_at_which_commit(page: Path) -> None:
    found = unstamped(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)}: a count without its date and commit:\n\n" + "\n\n".join(
        COUNT.search(b).group(0) + ": " + b.strip()[:300] for b in found)  # type: ignore[union-attr]


def test_the_check_catches_a_hand_copied_count() -> None:
    assert unstamped("The suite gives 141 passed, 13 skipped.\n")
    assert unstamped("Measured on 2026-12-02.\n\n| a | 12 skipped |\n")  # a date alone is not enough
    assert not unstamped("Measured on 2026-12-02 at commit ced6c4f.\n\n| a | 12 skipped |\n")
    assert not unstamped("```\n==== 226 passed, 44 skipped ====\n```\n")
