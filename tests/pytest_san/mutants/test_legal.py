"""Choices the contract leaves to a provider pass both checkers: the conformance suite and the reference model.

Each legal variant of ``pytest_san.mutants.legal`` named here is run as an author would run their provider
(``-p MODULE``), in a subprocess, and must fail no rule and get no divergence; a planted bug that breaks what
the contract now says of descriptors (R3) is found by the model.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.whole_suite  # each case runs the suite in a subprocess: not in tox (tox.ini)


def _report(pytester: pytest.Pytester, package: str, *extra: str) -> dict[str, object]:
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("--pyargs", package, "--san-report",
                                           str(report), *extra)
    assert report.exists(), result.stdout.str()[-3000:]
    data: dict[str, object] = json.loads(report.read_text())
    data["outcomes"] = result.parseoutcomes()
    return data


def _failed_rules(data: dict[str, object]) -> set[str]:
    rules = data["rules"]
    assert isinstance(rules, dict)
    return {rule for rule, counts in rules.items() if counts["failed"]}


LATE = "pytest_san.mutants.legal.late_completions"


def test_late_completions_pass_the_whole_suite(pytester: pytest.Pytester) -> None:
    """Completions seen 15 ms late (issue 27: the switch's flow control deadlocked from 10 ms on, and
    test_message_traffic_uses_only_the_two_regions timed out waiting for 122880 bytes)."""
    data = _report(pytester, "pytest_san.scenarios", "-p", LATE, "--late-completions-ms", "15",
                   "--san-model-sequences", "0")
    assert _failed_rules(data) == set()
    assert data["outcomes"].get("passed", 0) > 200  # type: ignore[union-attr]


@pytest.mark.parametrize("ms", ["0", "50"])
def test_the_switch_never_deadlocks_at_any_completion_latency(pytester: pytest.Pytester, ms: str) -> None:
    data = _report(pytester, "pytest_san.scenarios.test_switch", "-p", LATE, "--late-completions-ms", ms,
                   "--san-model-sequences", "0")
    assert _failed_rules(data) == set()
    rules = data["rules"]
    assert isinstance(rules, dict) and rules["R9"]["passed"] > 0 and rules["R10"]["passed"] > 0


def test_late_completions_get_no_divergence_from_the_model(pytester: pytest.Pytester) -> None:
    data = _report(pytester, "pytest_san.model", "-p", LATE, "--late-completions-ms", "15",
                   "--san-model-sequences", "20")
    model = data["model"]
    assert isinstance(model, dict) and model["sequences"] == 20 and model["divergences"] == []


CHOICES = ["string_handles", "pin_per_registration_call", "longer_descriptors"]
"""A handle that is no int; the same handle for a repeated registration with a pin for each call (R12); a
descriptor longer than pytest-san's providers' 20 bytes (CONTRACT.md sections 2 and 3)."""


@pytest.mark.parametrize("name", CHOICES)
def test_a_legal_choice_passes_the_suite(pytester: pytest.Pytester, name: str) -> None:
    data = _report(pytester, "pytest_san.scenarios", "-p", f"pytest_san.mutants.legal.{name}",
                   "--san-model-sequences", "0")
    assert _failed_rules(data) == set()
    assert data["outcomes"].get("passed", 0) > 200  # type: ignore[union-attr]


@pytest.mark.parametrize("name", CHOICES)
def test_a_legal_choice_gets_no_divergence_from_the_model(pytester: pytest.Pytester, name: str) -> None:
    """Before issue 27 the model said "not a handle (an int)" six times of string handles and "proxy of node 1:
    2 live allocations, the model has 1 (R12)" of a pin per registration call."""
    data = _report(pytester, "pytest_san.model", "-p", f"pytest_san.mutants.legal.{name}",
                   "--san-model-sequences", "100")
    model = data["model"]
    assert isinstance(model, dict) and model["sequences"] == 100 and model["divergences"] == []


def test_the_model_finds_a_deregistered_descriptor_handed_out_again(pytester: pytest.Pytester) -> None:
    """R3: a descriptor deregistered on a connection is never handed out again on it; a provider that gives a
    new registration the bytes of a freed one is caught by the model under R3."""
    data = _report(pytester, "pytest_san.model", "-p", "pytest_san.mutants.bugs.descriptor_reused_after_deregister",
                   "--san-model-sequences", "100")
    model = data["model"]
    assert isinstance(model, dict) and model["divergences"]
    assert all("R3" in found["rules"] for found in model["divergences"]), model["divergences"]


HUGE_DESCRIPTORS = '''
from pytest_san.mutants.legal.longer_descriptors import LongerDescriptors
from pytest_san.mutants.wrapping import provider_hook


class HugeDescriptors(LongerDescriptors):
    pad = 300


pytest_san_make_provider = provider_hook(HugeDescriptors)
'''


def test_descriptors_longer_than_a_message_pass_the_switch_scenarios(pytester: pytest.Pytester) -> None:
    """320-byte descriptors, in 128-byte messages (test_flow_control_survives_completions_seen_late): the switch
    sends a descriptor in as many messages as it takes (it wrote past the slot before)."""
    pytester.makepyfile(huge_descriptors=HUGE_DESCRIPTORS)
    data = _report(pytester, "pytest_san.scenarios.test_switch", "-p", "huge_descriptors",
                   "--san-model-sequences", "0")
    assert _failed_rules(data) == set()
    rules = data["rules"]
    assert isinstance(rules, dict) and rules["R10"]["passed"] > 0


UNEVEN_COMPLETIONS = '''
import random

from pytest_san.mutants.legal.slow_completions import SlowCompletions
from pytest_san.mutants.wrapping import provider_hook

RANDOM = random.Random({seed})


class Uneven:
    """Seen done only after a drawn number of polls: each operation late by its own amount."""

    def __init__(self, inner):
        self.inner = inner
        self.polls = RANDOM.choice([0, 0, 1, 2, 3, 8])

    def done(self):
        if self.polls > 0:
            self.polls -= 1
            return False
        return bool(self.inner.done())

    def wait(self, timeout=10.0):
        self.polls = 0
        return self.inner.wait(timeout)


class UnevenCompletions(SlowCompletions):
    def rdma_write(self, *args):
        return Uneven(self.inner.rdma_write(*args))

    def rdma_read(self, *args):
        return Uneven(self.inner.rdma_read(*args))

    def send(self, *args):
        return Uneven(self.inner.send(*args))

    def recv(self, *args):
        return Uneven(self.inner.recv(*args))


pytest_san_make_provider = provider_hook(UnevenCompletions)
'''


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_switch_never_deadlocks_whatever_each_completion_s_latency(pytester: pytest.Pytester, seed: int) -> None:
    """Every operation seen done after its own number of polls (none to 8, drawn from ``seed``): completions of
    sends, receives and RDMA show up in any order and any delay, deterministically, with no clock involved."""
    pytester.makepyfile(uneven_completions=UNEVEN_COMPLETIONS.format(seed=seed))
    data = _report(pytester, "pytest_san.scenarios.test_switch", "-p", "uneven_completions",
                   "--san-model-sequences", "0")
    assert _failed_rules(data) == set()
    rules = data["rules"]
    assert isinstance(rules, dict) and rules["R9"]["passed"] > 0 and rules["R10"]["passed"] > 0
