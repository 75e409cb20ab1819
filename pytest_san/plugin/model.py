"""The reference model in the verdict: ``pytest --pyargs pytest_san.scenarios`` runs it too.

The scenarios' ``test_model.py`` has one test per rule the model checks, each marked with its rule. They share
one model run, ``san_model`` (once per session, on the session's backend), and each fails only when a divergence
breaks its rule (``pytest_san.model.rules`` says which), so a divergence counts under the rules it breaks in the
terminal table, the ``--san-report`` JSON, the JUnit properties and pytest-html. The run's result is the report's
``"model"`` key, as ``pytest --pyargs pytest_san.model``'s is; that deep run (``san_model_runner``) stays.

The suite's budget: ``--san-model-sequences``, ``--san-model-steps`` and ``--san-model-deadline`` where given,
else what the backend declares (``model_budget()``, ``pytest_san.protocols.DeclaresModelBudget``: the hil backend
declares a lab's), else ``SUITE_BUDGET`` (the emulator: about a second). Its seed is ``--san-model-seed``, else
``SUITE_SEED``: the same provider gets the same verdict on every run. ``--san-model-sequences 0`` leaves the
model out of the suite: its tests are deselected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

import pytest

from ..protocols import ModelBudget
from ..report import ModelResult
from .capabilities import every_node
from .hooks import record_model

if TYPE_CHECKING:
    from ..model import Budget, Summary
    from ..protocols import Backend

SUITE_BUDGET = ModelBudget(sequences=100, steps=40, deadline=10.0)
"""The suite's model on a backend that declares no budget of its own: about 1 s on the emulator. The deadline
only bounds a provider the model finds wrong: shrinking each divergence replays its steps many times."""
SUITE_SEED = 1
DEEP_BUDGET = ModelBudget(sequences=100, steps=40)
"""``pytest --pyargs pytest_san.model``'s defaults (its seed: a fresh one each run, printed)."""
FIXTURE = "san_model"
"""The fixture of the suite's model tests (``--san-model-sequences 0`` deselects the tests that use it)."""
SUITE_MODEL_KEY = pytest.StashKey["ModelResult"]()
"""The suite's model run, once it ran (pytest-html shows each rule's test its divergences)."""

T = TypeVar("T")


def declared_budget(backend: Backend) -> ModelBudget:
    """What ``backend`` declares for the suite's model (``model_budget()``), else ``SUITE_BUDGET``."""
    declare = getattr(backend, "model_budget", None)
    if not callable(declare):
        return SUITE_BUDGET
    budget = declare()
    if not isinstance(budget, ModelBudget):
        raise pytest.UsageError(f"{type(backend).__name__}.model_budget() must return a "
                                f"pytest_san.protocols.ModelBudget, got {budget!r:.120}")
    return budget


def model_budget(config: pytest.Config, default: ModelBudget, seed: int | None) -> Budget:
    """The options where given, else ``default`` (and ``seed``)."""
    from ..model import Budget  # imported late: loading the plugin stays cheap

    def option(name: str, fallback: T) -> T:
        value = config.getoption(name)  # argparse gave it the type of its default (options.py)
        return fallback if value is None else cast(T, value)

    given_seed = config.getoption("san_model_seed")
    return Budget(sequences=int(option("san_model_sequences", default.sequences)),
                  steps=int(option("san_model_steps", default.steps)),
                  deadline=option("san_model_deadline", default.deadline),
                  seed=seed if given_seed is None else int(given_seed),
                  differential=bool(config.getoption("san_model_differential")),
                  checks=str(config.getoption("san_model_checks")))


def run_model(config: pytest.Config, backend: Backend, budget: Budget) -> tuple[Summary, ModelResult]:
    """Run the model on ``backend`` and add its result to the report's ``"model"`` key."""
    from ..model import ModelRun

    # What each node can do is read from the provider under test (a provider without RdmaRead is expected to
    # answer WSAEOPNOTSUPP there), as the scenarios' san_requires reads it.
    run = ModelRun(backend, budget, capabilities=every_node(config, backend))
    print(f"san model: {backend.name}, seed {run.seed} (replay: --san-model-seed {run.seed})")
    summary = run.run()
    print(f"san model: {summary.cost_line()}")
    data = summary.to_dict()
    result = ModelResult(summary.backend, summary.sequences, summary.steps, data["divergences"], [summary.seed],
                         summary.differential, summary.seconds, [f"{summary.backend}: {summary.cost_line()}"],
                         data["alternatives"], summary.regressions)
    record_model(config, ModelResult.from_dict(result.to_dict()))  # a copy: the report merges into its own
    return summary, result


def model_off(config: pytest.Config) -> bool:
    return bool(config.getoption("san_model_sequences") == 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--san-model-sequences 0``: the suite's model tests are deselected (``pytest_san.model`` still runs
    its past divergences' sequences then)."""
    if not model_off(config):
        return
    dropped = [item for item in items if FIXTURE in getattr(item, "fixturenames", ())]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if FIXTURE not in getattr(item, "fixturenames", ())]


@pytest.fixture(scope="session")
def san_model(pytestconfig: pytest.Config, san_backend: Backend) -> dict[str, list[str]]:
    """The suite's model run (once per session): each rule a divergence breaks -> those divergences, each with
    its shrunk steps and how to replay it."""
    budget = model_budget(pytestconfig, declared_budget(san_backend), SUITE_SEED)
    summary, result = run_model(pytestconfig, san_backend, budget)
    pytestconfig.stash[SUITE_MODEL_KEY] = result
    broken: dict[str, list[str]] = {}
    for divergence in summary.divergences:
        shown = f"{divergence.render()}\n  (replay: --san-model-seed {summary.seed})"
        for rule in divergence.rules:
            broken.setdefault(rule, []).append(shown)
    return broken


@pytest.fixture
def san_model_runner(pytestconfig: pytest.Config, san_backend: Backend) -> Callable[[], Summary]:
    """``pytest_san.model``'s deep run: the model at the options' budget, else ``DEEP_BUDGET``, with the
    options' seed, else a fresh one."""
    return lambda: run_model(pytestconfig, san_backend, model_budget(pytestconfig, DEEP_BUDGET, None))[0]
