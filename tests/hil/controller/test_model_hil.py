"""pytest_san.model over the hil backend: emulator-engine agents behind the test sshd, every call a round trip.

The same model and checks as on the emulator (tests/pytest_san/model/test_emulator.py), through the whole
remote path: SSH, the agent, the controller's stand-ins. Small budgets: a run is about one round trip per
call and per check. Real verbs: tests run there by hand or in CI's lab stage (docs/model.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.controller.backend import HilBackend
from pytest_san.model.regressions import REGRESSIONS
from pytest_san.model.run import ModelRun
from pytest_san.model.steps import plan_for
from pytest_san.spi.protocols import ModelBudget
from tests.support.lab_hosts import host_configs, write_inventory
from tests.support.sshd import SshServer


def _quiet(_: str) -> None:
    pass


def _budget(hil: HilBackend, *, sequences: int, seed: int, differential: bool = False) -> ModelBudget:
    """The hil backend's own settings (touched checks, long waits), at these tests' size and with no deadline."""
    return dataclasses.replace(hil.model_budget(), sequences=sequences, steps=20, deadline=None, seed=seed,
                               differential=differential)


@pytest.fixture
def hil(sshd: SshServer, tmp_path: Path) -> Iterator[HilBackend]:
    backend = HilBackend(host_configs(sshd, tmp_path, names=("modelA",)))
    yield backend
    backend.close()


def test_model_over_ssh(hil: HilBackend) -> None:
    summary = ModelRun(hil, _budget(hil, sequences=6, seed=21), log=_quiet).run()
    assert summary.divergences == [], "\n\n".join(d.render() for d in summary.divergences)
    assert (summary.backend, summary.sequences, summary.steps) == ("hil", 6, 120)
    # Remote: only what a step could change is checked after it ("touched"), everything at the end.
    assert summary.cost.checks > 0 and summary.cost.finish > 0


def test_model_over_ssh_with_two_nodes_and_differential(hil: HilBackend) -> None:
    # The lab's shape: two nodes, a second process spawned on each; every step also on a fresh emulator.
    run = ModelRun(hil, _budget(hil, sequences=5, seed=22, differential=True), plan=plan_for(2), log=_quiet)
    summary = run.run()
    assert summary.divergences == [], "\n\n".join(d.render() for d in summary.divergences)
    assert run.world.plan == plan_for(2) and summary.steps == 100


def test_model_from_the_command_line(pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "hosts.json", host_configs(sshd, tmp_path, names=("modelB",)))
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("--pyargs", "pytest_san.model",
                                           "--san-backend=hil", f"--san-inventory={inventory}",
                                           "--san-model-sequences", "3", "--san-model-steps", "10",
                                           "--san-report", str(report))
    result.assert_outcomes(passed=1)
    model = json.loads(report.read_text())["model"]
    assert (model["backend"], model["sequences"], model["steps"], model["divergences"]) == ("hil", 3, 30, [])
    regressions = len(REGRESSIONS)
    result.stdout.fnmatch_lines([f"*model on hil: 3 sequences, 30 steps, {regressions} regressions, 0 divergence(s)*",
                                 "*ms a step*"])
