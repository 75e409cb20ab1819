"""rsockets' declared deviations (pytest_san/observed_scenarios/deviations.py): each explains a scenario of its
rule, the kernel-bug one has a registered reproducer, and they are declared only where rsockets is observed.

On a lab the scenarios themselves show them deviating (docs/judging-a-switch.md); here, without one, the
declaration's conditions and the emulator run where the scenarios are skipped and nothing is declared."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from hil.lab.reproduce import REPRODUCERS
from pytest_san import Deviation
from pytest_san.observed import ObservedProcess
from pytest_san.observed_scenarios import conftest, test_nvme_rdma, test_rsockets
from pytest_san.observed_scenarios.deviations import NVME, NVME_POOL_KEYS, RSOCKETS
from pytest_san.spi.emulator import EmulatorBackend
from tests.pytest_san.plugin.test_plugin import FAKE_CONFTEST


class ObservingBackend:
    """Just enough of a backend that observes programs: its capabilities and ``spawn_observed``."""

    def __init__(self, capabilities: frozenset[str]) -> None:
        self.capabilities = capabilities

    def spawn_observed(self, node: object, program: str) -> ObservedProcess:
        raise AssertionError("not spawned here")


def _rules(name: str) -> set[str]:
    function = getattr(test_rsockets, name)
    return {str(arg) for mark in getattr(function, "pytestmark", []) if mark.name == "san_rule" for arg in mark.args}


@pytest.mark.parametrize("deviation", RSOCKETS, ids=lambda d: d.rule)
def test_each_names_a_scenario_of_its_rule(deviation: Deviation) -> None:
    for name in deviation.tests:
        assert deviation.rule in _rules(name), f"{name} is not a scenario of {deviation.rule}"
        assert deviation.explains(f"test_rsockets.py::{name}", [deviation.rule])


def test_none_is_a_strict_xfail_any_more() -> None:
    for deviation in RSOCKETS:
        for name in deviation.tests:
            marks = [m.name for m in getattr(getattr(test_rsockets, name), "pytestmark", [])]
            assert "xfail" not in marks, f"{name} is both xfail and declared: the deviation would never show"


def test_the_kernel_bug_has_a_registered_reproducer() -> None:
    bugs = [d for d in RSOCKETS if d.why == "kernel-bug"]
    assert [d.rule for d in bugs] == ["R11"]
    command = (bugs[0].reproducer or "").split()
    assert command[:3] == ["san-hil", "lab", "reproduce"] and command[3] in REPRODUCERS


class Config:
    def __init__(self, register_always: str) -> None:
        self.register_always = register_always

    def getoption(self, name: str) -> str:
        assert name == "san_nvme_register_always"
        return self.register_always


def test_declared_only_where_rsockets_is_observed() -> None:
    hook = conftest.pytest_san_deviations
    assert hook(Config("Y"), ObservingBackend(frozenset({"rsockets", "rdma_read"}))) == RSOCKETS  # type: ignore[arg-type]
    assert hook(Config("Y"), ObservingBackend(frozenset({"rdma_read"}))) is None  # type: ignore[arg-type]
    assert hook(Config("Y"), EmulatorBackend()) is None  # type: ignore[arg-type]


def test_nvme_deviations_where_nvme_rdma_is_observed_the_pool_key_with_y_only() -> None:
    hook = conftest.pytest_san_deviations
    both = ObservingBackend(frozenset({"rsockets", "nvme_rdma"}))
    assert hook(Config("Y"), both) == RSOCKETS + NVME + NVME_POOL_KEYS  # type: ignore[arg-type]
    assert hook(Config("N"), both) == RSOCKETS + NVME  # type: ignore[arg-type]
    assert {d.rule for d in NVME} == {"R2", "R6", "R7"} and NVME_POOL_KEYS[0].rule == "R3"


def test_on_the_emulator_the_scenarios_skip_and_nothing_is_declared(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--pyargs", "pytest_san.observed_scenarios", "--san-report", "report.json",
                                "-rs")
    scenarios = [n for module in (test_rsockets, test_nvme_rdma) for n in dir(module) if n.startswith("test_")]
    result.assert_outcomes(skipped=len(scenarios))
    result.stdout.fnmatch_lines(["*backend 'emulator' lacks capability 'rsockets'*"])
    result.stdout.fnmatch_lines(["*backend 'emulator' lacks capability 'nvme_rdma'*"])
    report: Mapping[str, Any] = json.loads((pytester.path / "report.json").read_text())
    assert report["deviations"] == []


# The fake backend of plugin/test_plugin.py, observing rsockets, with the observed scenarios' hooks.
OBSERVING = FAKE_CONFTEST + """
    from pytest_san.observed_scenarios.conftest import pytest_runtest_makereport, pytest_san_deviations

    class ObservingFake(FakeBackend):
        def spawn_observed(self, node, program):
            raise NotImplementedError

    def pytest_san_make_backend(config, name):
        return ObservingFake({"rsockets"}) if name == "fake" else None
"""

SCENARIOS = """
    import pytest

    @pytest.mark.san_rule("R9")
    def test_exactly_two_regions_per_connected_socket(san_backend):
        assert 3 == 2, "the connected socket holds 3 MRs"

    @pytest.mark.san_rule("R11")
    def test_rclose_with_a_live_riomap_releases_everything(san_backend):
        pytest.fail("R11: rclose ... close did not return within 15.0 s (CPU 0.99, state R)", pytrace=False)
"""


def test_a_deviating_scenarios_reason_says_what_this_run_saw(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(OBSERVING)
    pytester.makepyfile(test_rsockets=SCENARIOS)
    result = pytester.runpytest("--san-backend", "fake", "--san-report", "report.json",
                                "-rx")
    result.assert_outcomes(xfailed=2)
    result.stdout.fnmatch_lines(["XFAIL *test_rclose_with_a_live_riomap* - declared deviation: R11 by rsockets "
                                 "(librdmacm) (kernel-bug): *; this run: R11: rclose * did not return within 15.0 s*"])
    report: Mapping[str, Any] = json.loads((pytester.path / "report.json").read_text())
    reasons = {t["nodeid"].rpartition("::")[2]: t["reason"] for t in report["tests"]}
    assert reasons["test_exactly_two_regions_per_connected_socket"].endswith(
        "; this run: the connected socket holds 3 MRs assert 3 == 2")
    assert "; this run: R11: rclose ... close did not return within 15.0 s (CPU 0.99, state R)" in reasons[
        "test_rclose_with_a_live_riomap_releases_everything"]
    assert [d["observed"] for d in report["deviations"] if d["implementation"] == "rsockets (librdmacm)"] == [True,
                                                                                                            True]


def test_a_hang_of_a_kernel_driver_is_one_line_naming_its_modules() -> None:
    """A hung NVMe-oF step: the call, its deadline and state, a pool of MRs shortened, the modules that held them
    and the steps before it, on one line."""
    from pytest_san.observed import describe_hang

    line = describe_hang({"call": "disconnect", "deadline": 90, "cpu": 0.0, "state": "D",
                          "held": {"mr": [{"length": 0}] * 160, "qp": [{}, {}], "pd": [{}],
                                   "modules": {"nvme_rdma": 161, "rdma_cm": 2}},
                          "steps": ["host_module(register_always='Y')", "disconnect(nqn='x')"]})
    assert "\n" not in line and line.startswith("disconnect did not return within 90 s (CPU 0.0, state D)")
    assert "... (160 in all)" in line and "owned by nvme_rdma: 161, rdma_cm: 2" in line
    assert line.endswith("Steps: host_module(register_always='Y'); disconnect(nqn='x')")
