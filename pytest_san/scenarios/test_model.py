"""The reference model in the verdict: random SPI sequences, each step checked against a model written from the
contract, find what no scenario here shows (a check made on the first scatter entry only, an in-use mark
cleared too early, ...).

One test per rule the model checks. They share one run of the model on the session's backend (the ``san_model``
fixture: at the backend's budget, about a second on the emulator; ``--san-model-sequences 0`` leaves them out),
and each fails only when a divergence breaks its rule: the report counts every divergence under the rules it
breaks. ``pytest --pyargs pytest_san.model`` runs the same model deeper.
"""

from __future__ import annotations

import pytest

MODEL_RULES = ("R1", "R2", "R3", "R4", "R5", "R6", "R7", "R8", "R11", "R12", "R13", "R14")
"""The rules the model checks: the provider's (R9 and R10 are the switch's, P1-P5 the proxy driver's).
tests/pytest_san/plugin/test_model.py keeps this the model's own list."""


@pytest.mark.parametrize("rule", [pytest.param(rule, marks=pytest.mark.san_rule(rule), id=rule)
                                  for rule in MODEL_RULES])
def test_the_model_finds_no_divergence_breaking(rule: str, san_model: dict[str, list[str]]) -> None:
    found = san_model.get(rule, [])
    if found:
        shown = "\n\n".join(found)
        pytest.fail(f"the reference model found {len(found)} divergence(s) breaking {rule}:\n\n{shown}",
                    pytrace=False)
