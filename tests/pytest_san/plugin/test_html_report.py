"""pytest-html shows the rules: a Rules column, the per-rule summary with backend and capabilities, the model's
verdict as the model test's extra (pytest_san/plugin/html_report.py). The report's data is read as pytest-html
writes it (its JSON blob and its summary); tests/test_browser.py reads the same pages as rendered by Chromium."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from pytest_san.report import RULE_IDS

pytest.importorskip("pytest_html", reason="pytest-html is not installed (the test extra has it)")

SAN_TESTS = """
    import pytest

    from pytest_san import Access


    @pytest.mark.san_rule("R1")
    def test_passes(san_switch):
        san_switch.connect()


    @pytest.mark.san_rule("R6", "R7")
    def test_fails(san_backend):
        assert False, "a broken rule"


    @pytest.mark.san_rule("R2")
    @pytest.mark.san_requires("no_such_capability")
    def test_skipped(san_backend):
        pass


    @pytest.mark.san_rule("R3")
    def test_leaks(san_switch):
        conn = san_switch.connect()
        buf = conn.local.process.alloc(64)
        conn.local.provider.register_memory(conn.local.socket, buf, Access.READ)
        conn.local.provider.close_socket = lambda socket: None  # the switch's close then leaves it registered


    def test_plain():
        pass
"""


def report_data(path: Path) -> dict[str, Any]:
    """pytest-html 4's data: the JSON its page renders the table from."""
    blob = re.search(r'data-jsonblob="([^"]*)"', path.read_text(encoding="utf-8"))
    assert blob is not None, "no data blob in the report"
    data: dict[str, Any] = json.loads(unescape(blob.group(1)))
    return data


def rules_cells(data: dict[str, Any]) -> dict[str, str]:
    """test id (with ::setup / ::teardown for those rows) -> its Rules cell's text."""
    out = {}
    for rows in data["tests"].values():
        for row in rows:
            cells = row["resultsTableRow"]
            test_id = re.sub(r"<[^>]+>", "", cells[1])
            match = re.fullmatch(r'<td class="col-rules">(.*)</td>', cells[2])
            assert match is not None, cells
            out[test_id] = match.group(1)
    return out


def summary_counts(page: str) -> dict[str, dict[str, int]]:
    rows = re.findall(r'<tr data-rule="(\w+)"[^>]*><th scope="row">\w+</th>'
                      r'<td class="san-passed">(\d+)</td><td class="san-failed">(\d+)</td>'
                      r'<td class="san-skipped">(\d+)</td><td class="san-deviating">(\d+)</td></tr>', page)
    return {rule: {"passed": int(p), "failed": int(f), "skipped": int(s), "deviating": int(d)}
            for rule, p, f, s, d in rows}


def test_rules_column_and_summary(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_san=SAN_TESTS)
    result = pytester.runpytest_subprocess("--html=report.html", "--san-report=r.json")
    result.assert_outcomes(passed=3, failed=1, skipped=1, errors=1)  # test_leaks passes, its teardown errs
    page = (pytester.path / "report.html").read_text(encoding="utf-8")
    data = report_data(pytester.path / "report.html")

    assert '<th class="sortable" data-column-type="rules">Rules</th>' in page
    assert rules_cells(data) == {
        "test_san.py::test_passes": "R1", "test_san.py::test_fails": "R6 R7", "test_san.py::test_skipped::setup": "R2",
        "test_san.py::test_leaks": "R3", "test_san.py::test_leaks::teardown": "R3 R11", "test_san.py::test_plain": "",
    }

    report = json.loads((pytester.path / "r.json").read_text())
    assert summary_counts(page) == report["rules"] and list(summary_counts(page)) == list(RULE_IDS)
    # the leak, as the JSON counts it
    assert report["rules"]["R11"] == {"passed": 0, "failed": 1, "skipped": 0, "deviating": 0}
    assert '<strong class="san-backend">emulator</strong>' in page
    assert f'<span class="san-capabilities">{", ".join(report["capabilities"])}</span>' in page


def test_nothing_without_san_tests_and_nothing_without_html(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("--html=report.html")
    result.assert_outcomes(passed=1)
    page = (pytester.path / "report.html").read_text(encoding="utf-8")
    assert "san-summary" not in page  # no SAN test ran: no SAN summary
    assert rules_cells(report_data(pytester.path / "report.html")) == {"test_plain.py::test_plain": ""}
    pytester.makepyfile(test_san=SAN_TESTS)
    result = pytester.runpytest_subprocess("-k", "passes")
    result.assert_outcomes(passed=1, deselected=5)


def model_extras(path: Path) -> list[dict[str, Any]]:
    rows = report_data(path)["tests"]["test_model.py::test_model"]
    return [extra for row in rows for extra in row["extras"] if extra["name"] == "SAN model"]


def test_the_model_verdict_is_the_model_tests_extra(pytester: pytest.Pytester) -> None:
    budget = ["--san-model-sequences=3", "--san-model-steps=8", "--san-model-seed=1"]
    result = pytester.runpytest_subprocess("--pyargs", "pytest_san.model", *budget,
                                           "--html=ok.html")
    result.assert_outcomes(passed=1)
    (extra,) = model_extras(pytester.path / "ok.html")
    assert '<div class="san-model" data-verdict="passed">' in extra["content"]
    assert "no divergence in 3 sequence(s); seed 1" in extra["content"]

    # The shipped broken provider drops READ/WRITE from RDMA registrations: the model finds it and shrinks it.
    result = pytester.runpytest_subprocess("--pyargs", "pytest_san.model", *budget,
                                           "-p", "pytest_san.examples.broken_provider", "--html=bad.html",
                                           "--san-report=bad.json")
    result.assert_outcomes(failed=1)
    (extra,) = model_extras(pytester.path / "bad.html")
    divergences = json.loads((pytester.path / "bad.json").read_text())["model"]["divergences"]
    assert divergences and '<div class="san-model" data-verdict="diverged">' in extra["content"]
    content = unescape(extra["content"])
    assert f"{len(divergences)} divergence(s)" in content
    for div in divergences:
        assert div["message"] in content and "\n".join(div["steps"]) in content  # every shrunk step
