"""The known differences in the verdict (pytest_san/deviations.py's Deviation.known, pytest_san/known_differences.py):
a backend's workarounds and the model's documented alternatives, listed beside the declared deviations, never
deciding a test's outcome."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from pytest_san.deviations import Deviation
from pytest_san.known_differences import alternative, alternatives_in_effect
from pytest_san.model import alternatives
from pytest_san.report import ConformanceReport

from .plugin.test_plugin import FAKE_CONFTEST
from .test_deviations import TESTS

# The fake backend of plugin/test_plugin.py, holding three regions a connection, with a workaround of its own.
WORKING_AROUND = FAKE_CONFTEST + """
    from pytest_san import Deviation

    FakeBackend.regions = 3
    FakeBackend.known_differences = lambda self: [Deviation.known(
        "workaround", "fake-three-regions", "R9", "the fake engine", "the fake kernel wants a third region",
        "a control area", "kernel-bug", "san-hil lab reproduce fake-three-regions", hosts=("lab1", "lab2"))]
"""

# A legal variant (string handles, pytest_san.mutants.legal) that refuses at the call a scatter entry naming no
# handle of the socket: the model's refused-at-the-call alternative, taken.
REFUSING = """
    from pytest_san import SanError, WsaError
    from pytest_san.mutants.legal.string_handles import UNKNOWN, StringHandles
    from pytest_san.mutants.wrapping import provider_hook


    class RefusedAtTheCall(StringHandles):
        def substitute(self, socket, buffer, handle):
            inner = self._inner(socket, handle)
            if inner == UNKNOWN:
                raise SanError(WsaError.WSAEFAULT, "not a handle of this socket")
            return inner


    pytest_san_make_provider = provider_hook(RefusedAtTheCall)
"""
MODEL = ("--pyargs", "pytest_san.scenarios.test_model", "--san-model-sequences", "10")


def _report(pytester: pytest.Pytester) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((pytester.path / "report.json").read_text())
    return data


def _kind(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [entry for entry in report["deviations"] if entry["kind"] == kind]


def test_a_backend_s_workaround_is_listed_and_decides_no_outcome(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(WORKING_AROUND)
    pytester.makepyfile(test_switch=TESTS)
    result = pytester.runpytest("--san-backend", "fake", "--san-report", "report.json")
    result.assert_outcomes(passed=2, failed=1)  # the R9 failure stays a failure: nothing declared it
    report = _report(pytester)
    assert report["rules"]["R9"] == {"passed": 1, "failed": 1, "skipped": 0, "deviating": 0}
    assert report["deviations"] == [{
        "kind": "workaround", "rule": "R9", "implementation": "the fake engine",
        "what": "the fake kernel wants a third region", "why": "kernel-bug",
        "reproducer": "san-hil lab reproduce fake-three-regions", "tests": [], "observed": True,
        "name": "fake-three-regions", "instead": "a control area", "because": None, "hosts": ["lab1", "lab2"]}]
    result.stdout.re_match_lines([r"workaround R9 \(kernel-bug\) fake-three-regions by the fake engine on "
                                  r"lab1, lab2 \[applied\]"])


def test_a_workaround_alone_fails_nothing(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(WORKING_AROUND.replace("FakeBackend.regions = 3", "FakeBackend.regions = 2"))
    pytester.makepyfile(test_switch=TESTS)
    result = pytester.runpytest("--san-backend", "fake", "--san-report", "report.json")
    result.assert_outcomes(passed=3)
    assert result.ret == 0
    assert [e["name"] for e in _kind(_report(pytester), "workaround")] == ["fake-three-regions"]


def test_a_known_difference_that_is_not_one_is_named(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKE_CONFTEST + """
    FakeBackend.known_differences = lambda self: [("R9", "three")]
    """)
    pytester.makepyfile(test_switch=TESTS)
    result = pytester.runpytest("--san-backend", "fake", "--san-report", "report.json")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*FakeBackend.known_differences() gave ('R9', 'three'), "
                                 "not a known difference (pytest_san.Deviation.known)*"])


@pytest.mark.parametrize("family", ["xunit1", "xunit2"])
def test_the_junit_xml_carries_the_known_differences_on_the_suite(pytester: pytest.Pytester, family: str) -> None:
    pytester.makeconftest(WORKING_AROUND)
    pytester.makepyfile(test_switch=TESTS)
    pytester.runpytest("--san-backend", "fake", "--junitxml", "junit.xml", "-o", f"junit_family={family}")
    root = ET.parse(pytester.path / "junit.xml").getroot()
    (listed,) = [p.get("value") or "" for p in root.iter("property") if p.get("name") == "san_deviations"]
    (entry,) = json.loads(listed)
    assert (entry["kind"], entry["name"], entry["hosts"]) == ("workaround", "fake-three-regions", ["lab1", "lab2"])


def test_pytest_html_tells_the_kinds_apart(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_html")
    pytester.makeconftest(WORKING_AROUND)
    pytester.makepyfile(test_switch=TESTS)
    pytester.runpytest("--san-backend", "fake", "--html", "page.html", "--self-contained-html")
    page = (pytester.path / "page.html").read_text()
    assert ('<li data-rule="R9" data-observed="true" data-kind="workaround" title="the fake kernel wants a third '
            'region Instead: a control area">workaround R9 (kernel-bug) fake-three-regions') in page


def test_the_model_s_alternatives_in_effect_are_listed_once_it_ran(pytester: pytest.Pytester) -> None:
    """On the emulator the model takes none of them: in effect (by capability), not met, and no failure."""
    result = pytester.runpytest(*MODEL, "--san-report", "report.json")
    assert result.ret == 0
    report = _report(pytester)
    listed = _kind(report, "alternative")
    expected = alternatives_in_effect(report["capabilities"])
    assert [e["name"] for e in listed] == [a.name for a in expected] == [alternatives.REFUSED_AT_CALL]
    assert listed == [a.to_dict(False) for a in expected]
    assert not any(counts["deviating"] or counts["failed"] for counts in report["rules"].values())
    result.stdout.re_match_lines([r"alternative R14 \(spec-ambiguity\) refused-at-the-call for any backend "
                                  r"\[in effect, not met by the model\]"])


def test_an_alternative_the_provider_takes_is_met_by_the_model(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(REFUSING)
    result = pytester.runpytest(*MODEL, "--san-report", "report.json")
    assert result.ret == 0
    report = _report(pytester)
    assert report["model"]["alternatives"][alternatives.REFUSED_AT_CALL] > 0
    (listed,) = _kind(report, "alternative")
    assert listed["name"] == alternatives.REFUSED_AT_CALL and listed["observed"] is True
    result.stdout.re_match_lines([r"alternative R14 .* refused-at-the-call for any backend \[met by the model\]"])


def test_without_the_model_no_alternative_is_listed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="""
        import pytest

        @pytest.mark.san_rule("R3")
        def test_one(san_backend):
            pass
    """)
    pytester.runpytest("--san-report", "report.json").assert_outcomes(passed=1)
    assert _report(pytester)["deviations"] == []


def test_under_xdist_each_worker_s_hosts_merge_into_one_entry(pytester: pytest.Pytester) -> None:
    """``--dist each``: both workers run every test, so both build the backend and list the workaround."""
    pytester.makeconftest(WORKING_AROUND.replace('hosts=("lab1", "lab2")',
                                                 'hosts=(__import__("os").environ["PYTEST_XDIST_WORKER"],)'))
    pytester.makepyfile(test_switch=TESTS)
    pytester.runpytest_subprocess("-n", "2", "--dist", "each", "--san-backend", "fake", "--san-report",
                                  "report.json")
    (entry,) = _report(pytester)["deviations"]
    assert (entry["name"], entry["hosts"], entry["observed"]) == ("fake-three-regions", ["gw0", "gw1"], True)


def test_an_alternative_s_row_is_what_it_declares() -> None:
    alt = alternatives.Alternative("a", "verbs", "the case", "the emulator's", "the other", "the reason", "R6",
                                   "kernel-bug", "san-hil lab reproduce a", unless="iwarp")
    row = alternative(alt)
    assert (row.kind, row.name, row.rule, row.why, row.reproducer, row.instead, row.because, row.tests) == (
        "alternative", "a", "R6", "kernel-bug", "san-hil lab reproduce a", "the other", "the reason", ())
    assert (row.implementation, row.what) == ("a backend with `verbs` without `iwarp`",
                                              "the case (the emulator: the emulator's)")


def test_an_alternative_of_a_kernel_bug_without_its_reproducer_is_refused() -> None:
    alt = alternatives.Alternative("a", None, "the case", "the emulator's", "the other", "the reason", "R6",
                                   "kernel-bug")
    with pytest.raises(ValueError, match="alternative 'a' of R6: a kernel bug needs its reproducer"):
        alternative(alt)


def test_workers_known_differences_merge_their_hosts() -> None:
    left, right = ConformanceReport("hil"), ConformanceReport("hil")
    entry = Deviation.known("workaround", "w", "R14", "the verbs engine on rxe", "bug", "instead", "kernel-bug",
                            "san-hil lab reproduce w", hosts=("lab2",))
    left.merge_deviations([entry.to_dict(True)])
    right.merge_deviations([{**entry.to_dict(True), "hosts": ["lab1"]}])
    left.merge(ConformanceReport.from_dict(right.to_dict()))
    assert [(e["name"], e["hosts"]) for e in left.deviations] == [("w", ["lab1", "lab2"])]


def test_a_known_difference_serializes_every_field() -> None:
    entry = Deviation.known("alternative", "a", "R3", "any backend", "the case", "the other", "spec-ambiguity",
                            because="the reason")
    assert entry.to_dict(False) == {
        "kind": "alternative", "rule": "R3", "implementation": "any backend", "what": "the case",
        "why": "spec-ambiguity", "reproducer": None, "tests": [], "observed": False, "name": "a",
        "instead": "the other", "because": "the reason", "hosts": []}


@pytest.mark.parametrize(("fields", "says"), [
    ({"kind": "other"}, "kind 'other' is not one of declared, workaround, alternative"),
    ({"rule": "R0"}, "rule 'R0' is not a rule id"),
    ({"why": "luck"}, "why 'luck' is not one of"),
    ({"name": ""}, "name must be a non-empty text"),
    ({"instead": None}, "instead must be a non-empty text"),
    ({"tests": ("test_a",)}, "a known difference explains no test"),
    ({"reproducer": None}, "a kernel bug needs its reproducer"),
])
def test_a_bad_known_difference_is_refused_naming_the_field(fields: dict[str, Any], says: str) -> None:
    good: dict[str, Any] = {"kind": "workaround", "name": "w", "rule": "R14", "implementation": "x", "what": "y",
                            "instead": "z", "why": "kernel-bug", "reproducer": "san-hil lab reproduce w",
                            "tests": ()}
    with pytest.raises(ValueError, match=says):
        Deviation(**{**good, **fields})
