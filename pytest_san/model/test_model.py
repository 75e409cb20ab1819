"""The reference model against the selected backend: ``pytest --pyargs pytest_san.model [--san-backend ...]``.

Random SPI sequences (``--san-model-sequences`` of ``--san-model-steps`` steps, within
``--san-model-deadline`` seconds) run on raw connected sockets of ``san_backend``, each step checked
against the model (pytest_san.model.reference); ``--san-model-differential`` also runs them on a
fresh emulator and compares the two. A divergence fails the test with its shrunk steps; the run's
seed is printed (``--san-model-seed`` replays it) and the ``--san-report`` JSON gets a ``"model"``
section. A project model-checks its own provider by returning it from ``pytest_san_make_provider``.
"""

from __future__ import annotations

import pytest

from pytest_san.model.run import Budget, ModelRun
from pytest_san.plugin.capabilities import every_node
from pytest_san.plugin.hooks import record_model
from pytest_san.protocols import Backend
from pytest_san.report import ModelResult

# What the model checks (CONTRACT.md section 3): the provider's rules; R9/R10 are the switch's, P1-P5 the proxy's.
RULES = ("R1", "R2", "R3", "R4", "R5", "R6", "R7", "R8", "R11", "R12", "R13", "R14")


def budget(config: pytest.Config) -> Budget:
    def option(name: str, default: object) -> object:
        value = config.getoption(name)
        return default if value is None else value

    return Budget(sequences=int(option("san_model_sequences", 100)),  # type: ignore[call-overload]
                  steps=int(option("san_model_steps", 40)),  # type: ignore[call-overload]
                  deadline=config.getoption("san_model_deadline"), seed=config.getoption("san_model_seed"),
                  differential=bool(config.getoption("san_model_differential")),
                  checks=str(config.getoption("san_model_checks")))


@pytest.mark.san_rule(*RULES)
def test_model(san_backend: Backend, pytestconfig: pytest.Config) -> None:
    # What each node can do is read from the provider under test (a provider without RdmaRead is expected to
    # answer WSAEOPNOTSUPP there), as the scenarios' san_requires reads it.
    capabilities = every_node(pytestconfig, san_backend)
    run = ModelRun(san_backend, budget(pytestconfig), capabilities=capabilities)
    print(f"san model: {san_backend.name}, seed {run.seed} (replay: --san-model-seed {run.seed})")
    summary = run.run()
    print(f"san model: {summary.cost_line()}")
    data = summary.to_dict()
    record_model(pytestconfig, ModelResult(summary.backend, summary.sequences, summary.steps, data["divergences"],
                                           [summary.seed], summary.differential, summary.seconds,
                                           [f"{summary.backend}: {summary.cost_line()}"], data["alternatives"],
                                           summary.regressions))
    if summary.divergences:
        shown = "\n\n".join(d.render() for d in summary.divergences)
        pytest.fail(f"{len(summary.divergences)} divergence(s) from the model on {san_backend.name} "
                    f"(replay: --san-model-seed {summary.seed}):\n\n{shown}", pytrace=False)
