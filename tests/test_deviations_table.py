"""docs/deviations.md's table of every known difference is the code's: the declared deviations pytest-san ships,
the verbs engine's workarounds (quirks.py) and the model's documented alternatives (alternatives.py)."""

from __future__ import annotations

import re
from pathlib import Path

from hil.controller.workarounds import every_workaround
from pytest_san.deviations import Deviation
from pytest_san.known_differences import markdown_table
from pytest_san.observed_scenarios.deviations import NVME, NVME_POOL_KEYS, RSOCKETS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "deviations.md"
SHIPPED: dict[str, tuple[Deviation, ...]] = {
    "pytest_san/observed_scenarios/deviations.py": RSOCKETS + NVME + NVME_POOL_KEYS}
"""Every module of the package that declares deviations -> what it declares (the table's declared rows)."""
DEFINED_IN = "pytest_san/deviations.py"


def _declared() -> list[Deviation]:
    return [d for declared in SHIPPED.values() for d in declared]


def test_the_docs_table_is_the_code_s() -> None:
    table = markdown_table(_declared(), every_workaround())
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line == table[0]]
    assert len(starts) == 1, "docs/deviations.md must hold the table of known differences once"
    rows = []
    for line in lines[starts[0]:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    assert rows == table, ("docs/deviations.md's table differs from the code's; the table now:\n"
                           + "\n".join(table))


def test_every_module_that_ships_a_deviation_is_in_the_table() -> None:
    found = sorted(str(path.relative_to(ROOT)) for package in ("pytest_san", "hil")
                   for path in (ROOT / package).rglob("*.py")
                   if re.search(r"\bDeviation\(", path.read_text(encoding="utf-8")))
    assert [path for path in found if path != DEFINED_IN] == sorted(SHIPPED), (
        "a module declares deviations the table of docs/deviations.md leaves out: add it to SHIPPED")


def test_the_table_has_a_row_of_each_kind_for_everything() -> None:
    table = markdown_table(_declared(), every_workaround())
    kinds = [row.split(" | ")[0].lstrip("| ") for row in table[2:]]
    assert kinds.count("declared") == len(_declared()) > 0
    assert kinds.count("workaround") == len(every_workaround()) > 0
    assert kinds.count("alternative") > 0
