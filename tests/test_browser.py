"""The two result pages as a person sees them, in Debian's headless Chromium (issue 23): pytest-html's report of
the suite, and ``san-hil nightly``'s index.html for a nightly over two hosts behind the test sshd. From the
rendered DOM: the rule table and the matrix are there, and passed/failed/skipped per rule equal the same run's
``--san-report`` JSON. Each page's screenshot is kept ($SAN_ARTIFACTS in CI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hil.cli.main import main
from hil.inventory import HostConfig
from pytest_san.report import OUTCOMES
from tests.support import browser
from tests.support.lab_hosts import NAMES, pytest_env, write_inventory

pytest.importorskip("pytest_html", reason="pytest-html is not installed (the test extra has it)")

# One rule that fails on each host (with the host diagnostics the hil plugin attaches), beside the real scenarios.
INJECTED = '''
import pytest


@pytest.mark.san_rule("R6")
def test_injected_failure(san_switch):
    conn = san_switch.connect()
    assert conn.local.socket is None, "injected failure"
'''


def counts_in(row: browser.Element) -> dict[str, int]:
    return {outcome: int(row.find("td", class_=f"san-{outcome}").text) for outcome in OUTCOMES}


def test_pytest_html_report_in_chromium(tmp_path: Path) -> None:
    browser.chromium()
    # The shipped broken provider, so that the page has failed rules as well as passed ones.
    run = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "pytest_san.scenarios",
                          "-p", "pytest_san.examples.broken_provider", "--html=report.html", "--san-report=r.json",
                          "-o", "render_collapsed=all",  # the screenshot: rows, not tracebacks
                          "-o", "initial_sort=rules"],  # pytest-html's own sort, by the Rules column
                         cwd=tmp_path, capture_output=True, text=True, env=pytest_env(), timeout=600, check=False)
    assert run.returncode == 1, run.stdout[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    dom = browser.parse(browser.dump_dom(tmp_path / "report.html"))

    summary = dom.find("table", id="san-rules")
    shown = {row.attrs["data-rule"]: counts_in(row) for row in summary.find_all("tr") if "data-rule" in row.attrs}
    assert shown == report["rules"]
    assert dom.find("strong", class_="san-backend").text == "emulator"

    table = dom.find("table", id="results-table")
    assert [th.text.strip() for th in table.find("thead").find_all("th")][:3] == ["Result", "Test", "Rules"]
    # A test skipped in its setup (a capability the wrapped provider lacks) is pytest-html's "id::setup" row.
    rows = {row.find("td", class_="col-testId").text.removesuffix("::setup"): row.find("td", class_="col-rules").text
            for row in table.find_all("tr", class_="collapsible")}
    assert len(rows) == len(report["tests"])
    order = list(rows.values())  # as rendered: sorted by pytest-html's script on the Rules column
    assert order in (sorted(order), sorted(order, reverse=True)) and len(set(order)) > 10
    for test in report["tests"]:  # the test ids are the scenarios' node ids
        assert rows[test["nodeid"]] == " ".join(test["rules"]), test["nodeid"]
    failed = sorted({r for t in report["tests"] if t["outcome"] == "failed" for r in t["rules"]})
    assert failed == ["R6", "R7"]
    browser.screenshot(tmp_path / "report.html", browser.artifacts(tmp_path) / "pytest-html-report.png")


def test_nightly_index_in_chromium(tmp_path: Path, hosts: list[HostConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    browser.chromium()
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "test_injected.py").write_text(INJECTED)
    inventory = write_inventory(tmp_path / "lab.json", hosts)
    out = tmp_path / "nightly"
    status = main(["nightly", "--inventory", str(inventory), "--out", str(out), "--model-sequences=4",
                   "--model-steps=6", "--", "-p", "no:cacheprovider", "test_injected.py", "-k",
                   "injected or test_access or test_lifetime"])
    assert status == 1  # the injected failure
    index = out / "index.html"
    dom = browser.parse(browser.dump_dom(index))

    matrix = dom.find("table", id="matrix")
    assert [th.text for th in matrix.find("thead").find_all("th")] == ["rule", *NAMES]
    for name in NAMES:
        own = json.loads((out / "hosts" / name / "report.json").read_text())  # that run's --san-report
        cells = {td.attrs["data-rule"]: td for td in matrix.find_all("td", data_set=name) if "data-rule" in td.attrs}
        assert set(cells) == {rule for rule, c in own["rules"].items() if any(c.values())}
        for rule, td in cells.items():
            assert {k: int(td.attrs[f"data-{k}"]) for k in OUTCOMES} == own["rules"][rule]
        assert cells["R6"].attrs["class"] == "failed" and cells["R1"].attrs["class"] == "passed"
        link = cells["R1"].find("a").attrs["href"]
        assert link == f"hosts/{name}/report.html" and (out / link).is_file()
        model = matrix.find("td", data_set=name, data_model="passed")
        assert model.find("a").attrs["href"] == f"hosts/{name}/model/report.html"
        failure = dom.find("h3", class_="failure", data_set=name)
        assert "test_injected.py::test_injected_failure" in failure.text
    assert len(dom.find_all("details")) >= len(NAMES)  # the host diagnostics of each failure
    assert "rdma link show" in dom.find("details").text

    # The cell's link: that run's own pytest-html report, with its Rules column.
    linked = browser.parse(browser.dump_dom(out / "hosts" / NAMES[0] / "report.html"))
    assert "Rules" in [th.text.strip() for th in linked.find("table", id="results-table").find_all("th")]
    browser.screenshot(index, browser.artifacts(tmp_path) / "nightly-index.png", height=1400)
