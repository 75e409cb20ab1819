"""``san-hil nightly``: host sets, the four output files, the bandwidth in summary.md and report.json (the
measurement and the plot themselves: tests/hil/measure/test_bandwidth.py)."""

from __future__ import annotations

import functools
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from hil.cli.main import main
from hil.inventory import HostConfig
from hil.measure import bandwidth
from hil.nightly.plan import HostSet, host_sets
from hil.nightly.results import render_summary
from tests.support.lab_hosts import NAMES, write_inventory

INJECTED = '''
import pytest


@pytest.mark.san_rule("R6")
def test_injected_failure(san_switch):
    conn = san_switch.connect()
    assert conn.local.socket is None, "injected failure"
'''


def _host(name: str, engine: str = "verbs", loopback: bool = False) -> HostConfig:
    return HostConfig(name=name, host="10.0.0.1", engine=engine, loopback=loopback)  # type: ignore[arg-type]


# --- host sets -------------------------------------------------------------------------------------------


def test_host_sets_pair_verbs_hosts_and_keep_self_sufficient_hosts_alone() -> None:
    hosts = [_host("emu", "emulator"), _host("v1"), _host("v2"), _host("lo", loopback=True), _host("v3")]
    sets = host_sets(hosts)
    assert [s.name for s in sets] == ["emu", "v1+v2", "lo", "v2+v3"]  # the odd one out pairs with its predecessor
    assert [s.verbs for s in sets] == [False, True, True, True]
    with pytest.raises(ValueError, match="needs a partner"):
        host_sets([_host("alone")])


def test_summary_with_bandwidth() -> None:
    report: dict[str, Any] = {
        "status": "passed", "started": "2026-11-29T02:00:00.000+00:00", "duration": 61.0,
        "inventory": "lab.yaml", "group": "san", "pytest_args": [],
        "hosts": {"node1+node2": {"status": "passed", "exit_status": 0, "log": "x.log", "failures": [],
                                  "totals": {"passed": 80, "failed": 0, "skipped": 19},
                                  "rules": {"R1": {"passed": 7, "failed": 0, "skipped": 0},
                                            "P3": {"passed": 0, "failed": 0, "skipped": 3}}}},
        "bandwidth_png": True, "bandwidth_note": None,
        "bandwidth": {"node1+node2": {
            "harness": [{"bytes": 4096, "gbps": 0.01}, {"bytes": 65536, "gbps": 0.2}],
            "ib_write_bw": [{"bytes": 2, "gbps": 0.001}, {"bytes": 4096, "gbps": 2.47},
                            {"bytes": 65536, "gbps": 8.1}]}},
    }
    text = render_summary(report)
    assert text.startswith("# pytest-san nightly: \u2713 passed\n")
    row = "| **node1+node2** | \u2713 passed | 80 \u2713 \u00b7 0 \u2717 \u00b7 19 \u2013 | \u2713 7 | \u2013 |"
    assert row in text  # R1 passed by 7 tests; P3 only skipped
    assert "![RDMA write bandwidth: harness and ib_write_bw](bandwidth.png)" in text
    assert "| 4096 | 0.01 | 2.47 | 0.00405 |" in text and "| 65536 | 0.2 | 8.1 | 0.0247 |" in text  # with the ratio
    assert "| 2 |" not in text  # ib_write_bw's sizes below the harness's are left out of the table


def _nightly(tmp_path: Path, hosts: list[HostConfig], capsys: pytest.CaptureFixture[str], *pytest_args: str,
             monkeypatch: pytest.MonkeyPatch) -> tuple[int, Path, str]:
    for key in list(os.environ):
        if key.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS")):  # not for the nested pytest runs
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    inv = write_inventory(tmp_path / "lab.json", hosts)
    out = tmp_path / "nightly"
    # The suite only: the model in nightly has its own tests (test_model.py).
    status = main(["nightly", "--inventory", str(inv), "--out", str(out), "--no-model", "--", "-p", "no:cacheprovider",
                   *pytest_args])
    return status, out, capsys.readouterr().err  # progress: san-hil's log handler, on stderr


def test_nightly_on_two_emulator_hosts(tmp_path: Path, hosts: list[HostConfig], capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    status, out, said = _nightly(tmp_path, hosts, capsys, monkeypatch=monkeypatch)
    assert status == 0, said + "".join(p.read_text() for p in out.glob("hosts/*/pytest.log"))
    assert sorted(p.name for p in out.iterdir()) == ["hosts", "index.html", "junit.xml", "report.json", "summary.md"]

    junit = ET.parse(out / "junit.xml").getroot()
    suites = junit.findall("testsuite")
    assert junit.tag == "testsuites" and [s.get("name") for s in suites] == list(NAMES)
    for suite in suites:
        cases = suite.findall("testcase")
        assert len(cases) == int(suite.get("tests", "0")) > 50 and suite.get("failures") == "0"
        assert all(str(c.get("classname")).startswith(f"{suite.get('name')}.") for c in cases)

    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "passed" and list(report["hosts"]) == list(NAMES)
    for name, entry in report["hosts"].items():
        assert entry["hosts"] == [name] and entry["exit_status"] == 0 and entry["failures"] == []
        assert entry["rules"]["R1"]["status"] == "passed" and entry["rules"]["R1"]["passed"] > 0
        assert [lease["hosts"] for lease in entry["leases"]] == [[name]]
        assert entry["html"] == str(out / "hosts" / name / "report.html")  # each run's pytest-html report
    assert report["bandwidth"] is None and "No verbs hosts" in report["bandwidth_note"]
    for suite in suites:  # the runs' suite-level rules (xunit2, pytest's default family), kept in the merge
        rules = {p.get("name"): p.get("value", "") for p in suite.iter("property")}
        assert json.loads(rules["san_rules"])["test_access.py::test_handle_works_in_its_own_process"] == ["R1"]
        assert rules["san_backend"] == "hil"

    summary = (out / "summary.md").read_text()
    lines = summary.splitlines()
    assert lines[0] == "# pytest-san nightly: \u2713 passed"
    header = next(line for line in lines if line.startswith("| host |"))
    assert header.startswith("| host | result | tests | R1 | R2 |")
    rows = [line for line in lines if line.startswith("| **")]
    assert [r.split("|")[1].strip() for r in rows] == [f"**{n}**" for n in NAMES]
    assert all("\u2717" not in cell for r in rows for cell in r.split("|")[4:])  # no rule failed
    assert "No verbs hosts in the inventory" in summary and "bandwidth.png not written" in summary
    assert "## Failures" not in summary
    kernels = ", ".join(f"{n} `{os.uname().release}`" for n in NAMES)  # each host's kernel, as its agent saw it
    assert f"Kernels: {kernels}; the kernel's RDMA resource tracking: not read (no verbs host)" in summary
    assert all(entry["kernel"] == {name: os.uname().release} for name, entry in report["hosts"].items())
    assert "nightly: passed: wrote" in said


def test_nightly_fails_on_an_injected_failure_and_shows_its_diagnostics(
        tmp_path: Path, hosts: list[HostConfig], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "test_injected.py").write_text(INJECTED)
    status, out, said = _nightly(tmp_path, hosts, capsys, "test_injected.py", "-k",
                                 "injected or test_handle_works_in_its_own_process", monkeypatch=monkeypatch)
    assert status == 1, said
    junit = ET.parse(out / "junit.xml").getroot()
    assert [s.get("failures") for s in junit.findall("testsuite")] == ["1", "1"] and junit.get("failures") == "2"
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed"
    for name, entry in report["hosts"].items():
        assert entry["status"] == "failed" and entry["rules"]["R6"]["failed"] == 1
        (failure,) = entry["failures"]
        assert failure["nodeid"] == "test_injected.py::test_injected_failure"
        assert "injected failure" in failure["reason"]
        assert list(failure["diagnostics"]) == [name] and "rdma link show" in failure["diagnostics"][name]
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# pytest-san nightly: \u2717 FAILED")
    assert "| \u2717 1/1 |" in summary  # R6 on each host
    assert f"### {NAMES[0]}: `test_injected.py::test_injected_failure` (R6)" in summary
    assert f"<summary>host diagnostics: {NAMES[1]}</summary>" in summary


def test_nightly_shows_a_pytest_that_did_not_run(tmp_path: Path, hosts: list[HostConfig],
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    status, out, _ = _nightly(tmp_path, hosts, capsys, "--no-such-option", monkeypatch=monkeypatch)
    assert status == 1
    suites = ET.parse(out / "junit.xml").getroot().findall("testsuite")
    assert [s.get("errors") for s in suites] == ["1", "1"]
    error = suites[0].find("testcase/error")
    assert error is not None and "exited with status 4" in str(error.get("message"))
    assert "--no-such-option" in str(error.text)
    summary = (out / "summary.md").read_text()
    assert f"### {NAMES[0]}: pytest exited 4 without a failed test" in summary


def test_nightly_measures_bandwidth_on_verbs_sets(tmp_path: Path, hosts: list[HostConfig],
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The emulator hosts stand in for verbs pairs: the harness measures through them, ib_write_bw is absent.
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(HostSet, "verbs", property(lambda self: True))
    monkeypatch.setattr(bandwidth, "has_ib_write_bw", lambda agent: False)  # whatever this machine has
    monkeypatch.setattr(bandwidth, "measure_harness", functools.partial(bandwidth.measure_harness, seconds=0.05))
    status, out, said = _nightly(tmp_path, hosts, capsys, "-k", "test_handle_works_in_its_own_process",
                                 monkeypatch=monkeypatch)
    assert status == 0, said
    assert (out / "bandwidth.png").read_bytes().startswith(b"\x89PNG")
    report = json.loads((out / "report.json").read_text())
    for name in NAMES:
        entry = report["bandwidth"][name]
        assert [p["bytes"] for p in entry["harness"]] == [2 ** k for k in range(1, 24)]  # ib_write_bw -a's sizes
        assert "harness_error" not in entry and "ib_write_bw_error" not in entry
        assert entry["ib_write_bw"] == [] and "apt-get install perftest" in entry["ib_write_bw_missing"]
    summary = (out / "summary.md").read_text()
    assert "![RDMA write bandwidth: harness and ib_write_bw](bandwidth.png)" in summary
    assert f"**{NAMES[0]}** (Gb/s)" in summary and "| 4096 |" in summary
    assert f"{NAMES[0]}: ib_write_bw is not installed on the hosts" in summary
