"""The reference model in the verdict: ``pytest --pyargs pytest_san.scenarios`` runs it too.

The scenarios' ``test_model.py`` has one test per rule the model checks, each marked with its rule. They share
one model run, ``san_model`` (once per session, on the session's backend), and each fails only when a divergence
breaks its rule (``pytest_san.model.rules`` says which), so a divergence counts under the rules it breaks in the
terminal table, the ``--san-report`` JSON, the JUnit properties and pytest-html. The run's result is the report's
``"model"`` key, as ``pytest --pyargs pytest_san.model``'s is; that deep run (``san_model_runner``) stays.

The suite's budget (``pytest_san.spi.protocols.ModelBudget``) is what the backend declares (``model_budget()``,
``DeclaresModelBudget``: the emulator's takes about a second, the hil backend declares a lab's), else the
defaults; ``--san-model-sequences``, ``--san-model-steps``, ``--san-model-deadline`` and ``--san-model-checks``
override it where given (``dataclasses.replace``). Its seed is ``--san-model-seed``, else
``SUITE_SEED``: the same provider gets the same verdict on every run. ``--san-model-sequences 0`` leaves the
model out of the suite: its tests are deselected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from ..report import ModelResult
from ..spi.protocols import ModelBudget, budget_of
from .capabilities import every_node
from .hooks import record_model

if TYPE_CHECKING:
    from ..model import Summary
    from ..spi.protocols import Backend

SUITE_SEED = 1
DEEP = ModelBudget()
"""``pytest --pyargs pytest_san.model``'s size: the defaults (its seed: a fresh one each run, printed)."""
FIXTURE = "san_model"
"""The fixture of the suite's model tests (``--san-model-sequences 0`` deselects the tests that use it)."""
SUITE_MODEL_KEY = pytest.StashKey["ModelResult"]()
"""The suite's model run, once it ran (pytest-html shows each rule's test its divergences)."""


def declared_budget(backend: Backend) -> ModelBudget:
    """What ``backend`` declares for the suite's model (``model_budget()``), else ``ModelBudget()``."""
    try:
        return budget_of(backend)
    except TypeError as exc:
        raise pytest.UsageError(str(exc)) from None


def deep_budget(backend: Backend) -> ModelBudget:
    """``pytest_san.model``'s: the backend's settings at the defaults' size, with no deadline."""
    return dataclasses.replace(declared_budget(backend), sequences=DEEP.sequences, steps=DEEP.steps,
                               deadline=DEEP.deadline)


def with_options(config: pytest.Config, budget: ModelBudget, seed: int | None) -> ModelBudget:
    """``budget`` (and ``seed``) with what the options give."""
    sequences, steps, deadline, given_seed = (config.getoption(f"san_model_{name}")
                                              for name in ("sequences", "steps", "deadline", "seed"))
    checks = config.getoption("san_model_checks")  # auto: the budget's
    return dataclasses.replace(
        budget, sequences=budget.sequences if sequences is None else int(sequences),
        steps=budget.steps if steps is None else int(steps),
        deadline=budget.deadline if deadline is None else float(deadline),
        seed=seed if given_seed is None else int(given_seed),
        differential=bool(config.getoption("san_model_differential")),
        full_checks=budget.full_checks if checks == "auto" else checks == "all")


def run_model(config: pytest.Config, backend: Backend, budget: ModelBudget) -> tuple[Summary, ModelResult]:
    """Run the model on ``backend`` and add its result to the report's ``"model"`` key."""
    from ..model import ModelRun  # imported late: loading the plugin stays cheap

    # What each node can do is read from the provider under test (a provider without RdmaRead is expected to
    # answer WSAEOPNOTSUPP there), as the scenarios' san_requires reads it.
    run = ModelRun(backend, budget, capabilities=every_node(config, backend))
    print(f"san model: {backend.name}, seed {run.seed} (replay: --san-model-seed {run.seed})")
    summary = run.run()
    print(f"san model: {summary.cost_line()}")
    result = summary.result()
    record_model(config, result)
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
    budget = with_options(pytestconfig, declared_budget(san_backend), SUITE_SEED)
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
    """``pytest_san.model``'s deep run: the model at the options' budget, else ``deep_budget``, with the
    options' seed, else a fresh one."""
    return lambda: run_model(pytestconfig, san_backend, with_options(pytestconfig, deep_budget(san_backend), None))[0]
