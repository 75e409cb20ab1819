"""Choices the contract leaves to a provider pass both checkers: the conformance suite and the reference model.

Each legal variant of ``pytest_san.mutants.legal`` named here is run as an author would run their provider
(``-p MODULE``), in a subprocess, and must fail no rule and get no divergence.
"""

from __future__ import annotations

import json

import pytest


def _report(pytester: pytest.Pytester, package: str, *extra: str) -> dict[str, object]:
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("--pyargs", package, "-p", "no:cacheprovider", "--san-report",
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


@pytest.mark.parametrize("ms", ["0", "5", "50"])
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
