"""Declared deviations (pytest_san/deviations.py, pytest_san/plugin/deviations.py): a failure declared by an
implementation counts as deviating, a declared one that does not happen fails, and the report lists both."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from pytest_san import Deviation
from pytest_san.deviations import deviations_of
from pytest_san.report import ConformanceReport

from .plugin.test_plugin import FAKE_CONFTEST

TESTS = """
    import pytest

    @pytest.mark.san_rule("R9")
    def test_two_regions(san_backend):
        assert san_backend.regions == 2, f"{san_backend.regions} regions per connection"

    @pytest.mark.san_rule("R9", "R11")
    def test_released_at_close(san_backend):
        pass

    @pytest.mark.san_rule("R3")
    def test_not_reused(san_backend):
        pass
"""

# The fake backend of plugin/test_plugin.py, holding three regions a connection (as rsockets does), and declaring it.
DECLARING = FAKE_CONFTEST + """
    from pytest_san import Deviation

    FakeBackend.regions = 3

    def pytest_san_deviations(config, backend):
        return [Deviation("R9", "a fake switch", "three regions a connection: a control area besides the two",
                          "by-design", tests=(TESTED,))]
"""


def _run(pytester: pytest.Pytester, tested: str, *args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    pytester.makeconftest(DECLARING.replace("TESTED", repr(tested)))
    pytester.makepyfile(test_switch=TESTS)
    result = pytester.runpytest("--san-backend", "fake", "--san-report", "report.json",
                                "-rxX", *args)
    return result, json.loads((pytester.path / "report.json").read_text())


def test_a_failure_declared_is_deviating_not_failed(pytester: pytest.Pytester) -> None:
    result, report = _run(pytester, "test_two_regions")
    result.assert_outcomes(passed=2, xfailed=1)
    assert result.ret == 0
    assert report["rules"]["R9"] == {"passed": 1, "failed": 0, "skipped": 0, "deviating": 1}
    assert report["deviations"] == [{
        "kind": "declared", "rule": "R9", "implementation": "a fake switch",
        "what": "three regions a connection: a control area besides the two", "why": "by-design", "reproducer": None,
        "tests": ["test_two_regions"], "observed": True, "name": None, "instead": None, "because": None,
        "hosts": []}]
    (test,) = [t for t in report["tests"] if t["nodeid"].endswith("test_two_regions")]
    assert test["outcome"] == "deviating" and "a fake switch" in test["reason"]
    result.stdout.re_match_lines([r"rule +passed +failed +skipped +deviating", r"R9 +1 +0 +0 +1",
                                  r"deviation R9 \(by-design\) by a fake switch: three regions .* \[observed\]"])


def test_a_declared_deviation_that_does_not_happen_fails_as_a_strict_xfail(pytester: pytest.Pytester) -> None:
    result, report = _run(pytester, "test_released_at_close")  # it passes: the deviation is not there
    result.assert_outcomes(passed=1, failed=2)  # the undeclared R9 failure, and the unobserved declaration
    result.stdout.re_match_lines([r"\[declared deviation not observed\] the test passed: R9 by a fake switch",
                                  r"deviation R9 \(by-design\) by a fake switch: .* \[declared but NOT observed\]"])
    assert report["deviations"][0]["observed"] is False
    assert report["rules"]["R9"]["failed"] == 2 and report["rules"]["R9"]["deviating"] == 0


def test_a_deviation_explains_only_the_tests_of_its_rule(pytester: pytest.Pytester) -> None:
    result, report = _run(pytester, "test_*")  # test_not_reused matches the pattern, but checks R3 alone
    assert report["rules"]["R3"] == {"passed": 1, "failed": 0, "skipped": 0, "deviating": 0}
    result.assert_outcomes(passed=1, xfailed=1, failed=1)  # R9's passing test fails: declared, not observed


def test_a_backend_declares_its_own_through_a_deviations_method(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKE_CONFTEST + """
    from pytest_san import Deviation

    FakeBackend.regions = 3
    FakeBackend.deviations = lambda self: [Deviation("R9", "fake", "three", "kernel-bug", ("test_two_regions",),
                                                     reproducer="san-hil lab reproduce three")]
    """)
    pytester.makepyfile(test_switch=TESTS)
    result = pytester.runpytest("--san-backend", "fake", "--san-report", "report.json")
    result.assert_outcomes(passed=2, xfailed=1)
    report = json.loads((pytester.path / "report.json").read_text())
    assert report["deviations"][0]["reproducer"] == "san-hil lab reproduce three"


def test_a_hook_answer_that_is_not_a_deviation_is_named(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKE_CONFTEST + """
    def pytest_san_deviations(config, backend):
        return [("R9", "three regions")]
    """)
    pytester.makepyfile(test_switch=TESTS)
    result = pytester.runpytest("--san-backend", "fake")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*pytest_san_deviations gave ('R9', 'three regions'), not a pytest_san.Deviation*"])


@pytest.mark.parametrize(("fields", "says"), [
    ({"rule": "R15"}, "rule 'R15' is not a rule id"),
    ({"why": "because"}, "why 'because' is not one of by-design, kernel-bug, spec-ambiguity"),
    ({"tests": ()}, "tests must name the tests it explains"),
    ({"tests": "test_x"}, "tests must name the tests it explains"),
    ({"implementation": " "}, "implementation must be a non-empty text"),
    ({"why": "kernel-bug"}, "a kernel bug needs its reproducer"),
])
def test_a_bad_declaration_is_refused_naming_the_field(fields: dict[str, Any], says: str) -> None:
    good: dict[str, Any] = {"rule": "R9", "implementation": "x", "what": "y", "why": "by-design",
                            "tests": ("test_a",)}
    with pytest.raises(ValueError, match=says):
        Deviation(**{**good, **fields})


def test_workers_reports_merge_observed_deviations() -> None:
    entry = Deviation("R3", "x", "y", "spec-ambiguity", ("t",)).to_dict(False)
    left, right = ConformanceReport("emulator"), ConformanceReport("emulator")
    left.merge_deviations([entry])
    right.merge_deviations([{**entry, "observed": True}])
    left.merge(ConformanceReport.from_dict(right.to_dict()))
    assert left.deviations == [{**entry, "observed": True}]


def test_pytest_html_lists_the_deviations(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_html")
    _run(pytester, "test_two_regions", "--html", "page.html", "--self-contained-html")
    page = (pytester.path / "page.html").read_text()
    assert '<td class="san-deviating">1</td>' in page
    assert ('<li data-rule="R9" data-observed="true" data-kind="declared">deviation R9 (by-design) by a fake switch'
            in page)


@pytest.mark.parametrize("family", ["xunit1", "xunit2"])
def test_the_junit_xml_names_the_deviation(pytester: pytest.Pytester, family: str) -> None:
    _run(pytester, "test_two_regions", "--junitxml", "junit.xml", "-o", f"junit_family={family}")
    root = ET.parse(pytester.path / "junit.xml").getroot()
    case = next(c for c in root.iter("testcase") if c.get("name") == "test_two_regions")
    assert case.find("skipped") is not None  # pytest writes an xfail so
    if family == "xunit1":
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props["san_deviation"].startswith("R9 by a fake switch (by-design)")
    else:
        suite = {p.get("name"): p.get("value") for p in root.iter("property")}
        assert json.loads(suite["san_deviations"])[0]["observed"] is True


def test_a_known_difference_is_no_declaration() -> None:
    """One type holds both; a known difference explains no test, so a backend cannot declare one."""
    class Declaring:
        def deviations(self) -> list[Deviation]:
            return [Deviation.known("workaround", "w", "R3", "x", "y", "z", "by-design")]

    with pytest.raises(TypeError, match=r"Declaring\.deviations\(\) gave .*, not a declared pytest_san\.Deviation"):
        deviations_of(Declaring())
