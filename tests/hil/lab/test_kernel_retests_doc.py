"""docs/lab.md's table of each reproducer retested per kernel names every workaround of
hil/agent/engines/verbs/quirks.py, on every kernel the lab boots, with the verdict quirks.py's ``retested``
records (issue 30, item 5: the docs and the engine's data must not drift apart)."""

from __future__ import annotations

import re
from pathlib import Path

from hil.agent.engines.verbs import quirks
from hil.lab.reproduce import REPRODUCERS

DOC = Path(__file__).resolve().parents[3] / "docs" / "lab.md"
MARK = "Each reproducer retested"
VERDICTS = {quirks.THERE: "still there", quirks.GONE: "gone"}


def _table() -> tuple[list[str], dict[str, list[str]]]:
    """The header cells and the rows (by the reproducer's name) of the table after ``MARK``."""
    text = DOC.read_text(encoding="utf-8")
    lines = text[text.index(MARK):].splitlines()
    start = next(at for at, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    header, body = rows[0], rows[2:]
    named = {}
    for cells in body:
        name = re.match(r"`([a-z0-9-]+)`", cells[0])
        assert name, f"docs/lab.md: a row that names no reproducer: {cells[0]!r}"
        named[name.group(1)] = cells
    return header, named


def test_the_table_has_a_column_per_kernel_the_lab_boots() -> None:
    header, _ = _table()
    assert [re.match(r"\d+\.\d+", cell).group(0) for cell in header[1:]] == [  # type: ignore[union-attr]
        f"{major}.{minor}" for major, minor in quirks.KERNELS]


def test_the_table_names_every_workaround_with_the_verdict_quirks_records() -> None:
    _, rows = _table()
    assert {w.name for w in quirks.WORKAROUNDS} <= set(rows)
    for w in quirks.WORKAROUNDS:
        found = dict(w.retested)
        for series, cell in zip(quirks.KERNELS, rows[w.name][1:], strict=True):
            assert cell.startswith(VERDICTS[found[series]]), (w.name, series, cell)


def test_every_row_is_a_reproducer_and_every_reproducer_a_row() -> None:
    _, rows = _table()
    assert set(rows) == set(REPRODUCERS)
    for cells in rows.values():
        assert all(re.match(r"(still there|gone|cannot tell|not run)\b", cell) for cell in cells[1:]), cells


def test_a_bug_of_two_parts_is_there_while_either_part_is() -> None:
    """siw-unchecked-remote-access tries a read and an over-long write: on 6.12 both were still there."""
    from hil.lab.reproduce import worst

    assert worst("gone", "still there") == worst("inconclusive", "still there") == "still there"
    assert worst("gone", "gone") == "gone"
    assert worst("gone", "inconclusive") == worst() == "inconclusive"
