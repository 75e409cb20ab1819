"""Issue 37's fourth held-out set, written from the docs alone (``tests/support/held_out_fourth``), is measured as
the issue asks: every bug caught, at least 90% of them under every rule they break, no legal variant failed.

One ``san-hil mutants --plugin`` run over the folder, the reference model included, as an author would measure
their own bugs (docs/providers.md): the kill matrix's verdicts are the measure. Bugs caught under only some of the
rules they break are listed in ``PARTIAL`` with why; one caught under all of them now fails until it leaves it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SET = ROOT / "tests" / "support" / "held_out_fourth"

PARTIAL: dict[str, str] = {}
"""Bugs caught under some of the rules they break, not all: name -> why the rest is not seen."""

pytestmark = pytest.mark.whole_suite  # the suite once per module: not in tox (tox.ini)


def test_the_fourth_held_out_set_is_caught_under_its_rules_and_its_legal_variants_pass(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "hil.cli", "mutants", "--plugin", str(SET), "--model",
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
    assert (out / "mutants.json").exists(), result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((out / "mutants.json").read_text())
    bugs, legal = data["mutants"], data["legal"]
    assert len(bugs) >= 20 and len(legal) >= 5, (sorted(bugs), sorted(legal))
    assert {name: v["verdict"] for name, v in bugs.items() if v["verdict"] != "caught"} == {}
    partial = {name: v["missed"] for name, v in bugs.items() if v["caught_under"] != "all"}
    assert sorted(partial) == sorted(PARTIAL), partial
    assert len(partial) <= len(bugs) // 10, f"more than 10% caught under only part of their rules: {partial}"
    assert {name: v["failed"] for name, v in legal.items() if v["failed"]} == {}
    assert {name: data["model"][name] for name in legal if data["model"][name].get("divergences")} == {}
    assert result.returncode == 0, result.stdout[-3000:]
