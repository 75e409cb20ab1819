"""The reference model against the selected backend: ``pytest --pyargs pytest_san.model [--san-backend ...]``.

The deep run: random SPI sequences (``--san-model-sequences`` of ``--san-model-steps`` steps, default 100 of
40, within ``--san-model-deadline`` seconds) run on raw connected sockets of ``san_backend``, each step checked
against the model (pytest_san.model.reference); ``--san-model-differential`` also runs them on a fresh emulator
and compares the two. A divergence fails the test with its shrunk steps and the rules it breaks; the run's seed
is printed (``--san-model-seed`` replays it) and the ``--san-report`` JSON gets a ``"model"`` section. A project
model-checks its own provider by returning it from ``pytest_san_make_provider``. The suite
(``pytest --pyargs pytest_san.scenarios``) runs the same model at a small budget as part of its verdict
(pytest_san/plugin/model.py, pytest_san/scenarios/test_model.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_san.model.rules import MODEL_RULES
from pytest_san.model.run import Summary

RULES = MODEL_RULES
"""What the model checks (CONTRACT.md section 3): the provider's rules; R9/R10 are the switch's, P1-P5 the
proxy's."""


@pytest.mark.san_rule(*RULES)
def test_model(san_model_runner: Callable[[], Summary]) -> None:
    summary = san_model_runner()
    if summary.divergences:
        shown = "\n\n".join(d.render() for d in summary.divergences)
        pytest.fail(f"{len(summary.divergences)} divergence(s) from the model on {summary.backend} "
                    f"(replay: --san-model-seed {summary.seed}):\n\n{shown}", pytrace=False)
