"""The plugin as downstream projects use it: the README's example and a test file from CONTRACT.md section 5, and
a broken provider."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import readme

HERE = Path(__file__).resolve().parents[2]


def test_downstream_file_passes_with_the_installed_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_readme=readme.example(),
                        test_downstream=(HERE / "support" / "downstream_example.py").read_text())
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=2)


def _run_suite(pytester: pytest.Pytester, *extra: str) -> dict[str, dict[str, int]]:
    report = pytester.path / "report.json"
    pytester.runpytest_subprocess("--pyargs", "pytest_san.scenarios",
                                  "--san-report", str(report), *extra)
    rules: dict[str, dict[str, int]] = json.loads(report.read_text())["rules"]
    return rules


def test_broken_provider_fails_exactly_the_access_rules(pytester: pytest.Pytester) -> None:
    """The shipped example (CONTRACT.md section 5's binding name): importable from the installed package alone."""
    rules = _run_suite(pytester, "-p", "pytest_san.examples.broken_provider")
    failing = {rule for rule, counts in rules.items() if counts["failed"]}
    assert failing == {"R6", "R7"}
    for rule in ("R1", "R2", "R3", "R8", "R11", "R13"):
        assert rules[rule]["passed"] > 0


def test_correct_provider_passes_every_rule(pytester: pytest.Pytester) -> None:
    rules = _run_suite(pytester)
    assert {rule for rule, counts in rules.items() if counts["failed"]} == set()
    assert all(counts["passed"] > 0 for counts in rules.values()), rules
