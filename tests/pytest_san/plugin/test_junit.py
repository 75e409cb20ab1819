"""The rules in JUnit XML (docs/reports.md, pytest_san/plugin/junit.py): per test under xunit1 and
legacy, one suite-level JSON property under xunit2, without a warning; the same under pytest-xdist."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from tests.pytest_san.plugin.test_html_report import SAN_TESTS


def run(pytester: pytest.Pytester, *args: str) -> ET.Element:
    pytester.makepyfile(test_san=SAN_TESTS)
    result = pytester.runpytest_subprocess("-W", "error", "--junitxml=junit.xml",
                                           "--san-report=r.json", *args)
    result.assert_outcomes(passed=3, failed=1, skipped=1, errors=1)
    assert "warning" not in result.stdout.str().lower()
    return ET.parse(pytester.path / "junit.xml").getroot()


def case_properties(root: ET.Element) -> dict[str, list[tuple[str, str]]]:
    return {case.get("name", ""): [(p.get("name", ""), p.get("value", "")) for p in case.iter("property")]
            for case in root.iter("testcase")}


@pytest.mark.parametrize("family", ["xunit1", "legacy"])
def test_per_test_rules_under_xunit1(pytester: pytest.Pytester, family: str) -> None:
    props = case_properties(run(pytester, "-o", f"junit_family={family}"))
    backend = ("san_backend", "emulator")
    assert props == {
        "test_passes": [("san_rule", "R1"), backend],
        "test_fails": [("san_rule", "R6"), ("san_rule", "R7"), backend],
        "test_skipped": [("san_rule", "R2"), backend],
        "test_leaks": [("san_rule", "R3"), ("san_rule", "R11"), backend],  # the leak counts against R11
        "test_plain": [],
    }


def test_suite_level_rules_under_xunit2(pytester: pytest.Pytester) -> None:
    root = run(pytester)  # pytest's default family
    (suite,) = root.iter("testsuite")
    suite_props = {p.get("name"): p.get("value", "") for p in suite.find("properties") or []}
    assert not any(case.find("properties") is not None for case in suite.iter("testcase"))  # xunit2 has none
    report = json.loads((pytester.path / "r.json").read_text())
    assert json.loads(suite_props["san_rules"]) == {t["nodeid"]: t["rules"] for t in report["tests"]}
    assert json.loads(suite_props["san_rules"])["test_san.py::test_leaks"] == ["R3", "R11"]
    assert suite_props["san_backend"] == "emulator"


def test_under_xdist(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    props = case_properties(run(pytester, "-n", "2", "-o", "junit_family=xunit1"))
    assert props["test_fails"] == [("san_rule", "R6"), ("san_rule", "R7"), ("san_backend", "emulator")]
    root = run(pytester, "-n", "2")
    (suite,) = root.iter("testsuite")
    rules = json.loads(next(p.get("value", "") for p in suite.iter("property") if p.get("name") == "san_rules"))
    assert rules["test_san.py::test_fails"] == ["R6", "R7"] and len(rules) == 4  # the SAN tests
