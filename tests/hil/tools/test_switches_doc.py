"""docs/switches.md's five-minute example, run as written from an empty directory: its files, then its commands,
whose output must show the lines the docs show (the matcher of ``test_providers_doc``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_providers_doc import _run_example

DOC = Path(__file__).resolve().parents[3] / "docs" / "switches.md"


def _section(title: str) -> str:
    """From the heading ``title`` to the next heading (outside code blocks)."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and title in line)
    fenced, end = False, len(lines)
    for at in range(start + 1, len(lines)):
        fenced ^= lines[at].startswith("```")
        if not fenced and lines[at].startswith("#"):
            end = at
            break
    return "\n".join(lines[start:end]) + "\n"


@pytest.mark.whole_suite
def test_the_five_minute_switch_example_works_as_written(tmp_path: Path) -> None:
    example = tmp_path / "empty"
    example.mkdir()
    _run_example(example, [_section("## A switch in five minutes")])
