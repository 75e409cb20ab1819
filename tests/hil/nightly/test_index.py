"""``san-hil nightly``'s index.html from a report.json (hil/nightly/index.py): the matrix with its links and
counts, the model per host set with its divergences, the bandwidth plot inline with the ratio, the diagnostics.
tests/test_browser.py opens the page of a real nightly in Chromium."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from hil.measure.bandwidth import plot_bandwidth
from hil.nightly.index import render_index, write_index
from tests.support.browser import Element, parse

DIVERGENCE = {"kind": "shrunk", "seed": 3, "sequence": 44, "side": "hil", "category": "completion",
              "step": "Transfer(recv)", "message": "operation op#8: SUCCESS 4 bytes, expected LOCAL_PROTECTION",
              "steps": ["  setup: p0 = the default process on node 0", "  1. s1 register_memory(p2/b1[14:33], READ)"]}


def _report(out: Path) -> dict[str, Any]:
    html = out / "hosts" / "lab1+lab2" / "report.html"
    html.parent.mkdir(parents=True)
    html.write_text("<html></html>")
    failure = {"nodeid": "test_access.py::test_peer_write_into_read_descriptor_is_rejected", "rules": ["R6"],
               "reason": "AssertionError: 4096 bytes moved", "diagnostics": {"lab1": "$ rdma link show\nlink rxe0/1"}}
    return {
        "status": "failed", "started": "2026-11-29T02:00:00.000+00:00", "duration": 61.0, "inventory": "lab.yaml",
        "group": "san", "pytest_args": ["-p", "no:cacheprovider"], "rules": ["R1", "R6", "P3"],
        "hosts": {
            "lab1+lab2": {"status": "failed", "exit_status": 1, "log": "x.log", "html": str(html),
                          "failures": [failure], "totals": {"passed": 80, "failed": 1, "skipped": 3},
                          "rules": {"R1": {"passed": 7, "failed": 0, "skipped": 0, "status": "passed"},
                                    "R6": {"passed": 5, "failed": 1, "skipped": 0, "status": "failed"},
                                    "P3": {"passed": 0, "failed": 0, "skipped": 3, "status": "skipped"}}},
            "lab3+lab4": {"status": "passed", "exit_status": 0, "log": "y.log", "html": None, "failures": [],
                          "totals": {"passed": 80, "failed": 0, "skipped": 3},
                          "rules": {"R1": {"passed": 7, "failed": 0, "skipped": 0, "status": "passed"}}},
        },
        "model": {"status": "failed", "sequences": 2000, "steps": 39991, "divergences": 1,
                  "budget": {"per_set": 1000, "steps": 20, "differential": False, "deadline": None},
                  "sets": {"lab1+lab2": {"status": "diverged", "exit_status": 1, "backend": "hil", "sequences": 1000,
                                         "steps": 19991, "seed": 3, "divergences": [DIVERGENCE], "html": None,
                                         "replay": "pytest --pyargs pytest_san.model --san-model-seed=3",
                                         "diagnostics": {}, "log": "m.log"},
                           "lab3+lab4": {"status": "passed", "exit_status": 0, "backend": "hil", "sequences": 1000,
                                         "steps": 20000, "seed": 1402, "divergences": [], "html": None,
                                         "diagnostics": {}, "log": "n.log"}}},
        "bandwidth_png": False, "bandwidth_note": None,
        "bandwidth": {"lab1+lab2": {"harness": [{"bytes": 4096, "gbps": 0.06}, {"bytes": 65536, "gbps": 0.12}],
                                    "ib_write_bw": [{"bytes": 4096, "gbps": 0.05}, {"bytes": 65536, "gbps": 0.08}]},
                      "lab3+lab4": {"harness": [{"bytes": 4096, "gbps": 0.05}], "ib_write_bw": [],
                                    "ib_write_bw_missing": "ib_write_bw is not installed on the hosts"}},
    }


def _cell(dom: Element, rule: str, name: str) -> Element:
    (cell,) = [td for td in dom.find_all("td", data_rule=rule) if td.attrs["data-set"] == name]
    return cell


def test_the_matrix_links_each_cell_to_its_runs_report_and_carries_its_counts(tmp_path: Path) -> None:
    dom = parse(render_index(_report(tmp_path), tmp_path))
    matrix = dom.find("table", id="matrix")
    assert [tr.find("th").text for tr in matrix.find("tbody").find_all("tr")] == ["suite", "R1", "R6", "P3", "model"]
    r6 = _cell(dom, "R6", "lab1+lab2")
    assert r6.attrs["class"] == "failed" and r6.text == "\u2717 1/6"
    assert (r6.attrs["data-passed"], r6.attrs["data-failed"], r6.attrs["data-skipped"]) == ("5", "1", "0")
    assert r6.find("a").attrs["href"] == "hosts/lab1+lab2/report.html"  # relative: the folder moves whole
    p3 = _cell(dom, "P3", "lab1+lab2")
    assert p3.attrs["class"] == "skipped" and "3 skipped" in p3.text
    absent = _cell(dom, "R6", "lab3+lab4")  # not exercised on that set: zeros, no link (no report.html there)
    assert absent.attrs["class"] == "none" and absent.attrs["data-passed"] == "0" and not absent.find_all("a")
    models = {td.attrs["data-set"]: td for td in matrix.find_all("td") if "data-model" in td.attrs}
    assert models["lab1+lab2"].attrs["data-model"] == "diverged" and "1 divergence" in models["lab1+lab2"].text
    assert models["lab3+lab4"].text == "\u2713 1000 sequences"


def test_the_model_the_bandwidth_and_the_diagnostics(tmp_path: Path) -> None:
    dom = parse(render_index(_report(tmp_path), tmp_path))
    assert "2000 sequences" in dom.find("p", class_="verdict").text
    assert "hil: completion after a Transfer(recv) step (seed 3, sequence 44" in dom.find("p", class_="divergence").text
    assert "s1 register_memory(p2/b1[14:33], READ)" in dom.find("pre").text
    assert any("--san-model-seed=3" in code.text for code in dom.find_all("code"))
    rows = {tr.attrs["data-bytes"]: [td.text for td in tr.find_all("td")]
            for tr in dom.find("table", class_="bandwidth", data_set="lab1+lab2").find_all("tr") if tr.attrs}
    assert rows == {"4096": ["0.06", "0.05", "1.2"], "65536": ["0.12", "0.08", "1.5"]}  # harness, perftest, ratio
    assert "ib_write_bw is not installed" in dom.find("p", class_="failed").text
    failure = dom.find("h3", class_="failure", data_set="lab1+lab2")
    assert "test_peer_write_into_read_descriptor_is_rejected" in failure.text and "(R6)" in failure.text
    assert "link rxe0/1" in dom.find("details").text
    assert not dom.find_all("img")  # no plot drawn: none inline


def test_the_plot_is_inline(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = _report(tmp_path)
    series = {name: {tool: [(p["bytes"], p["gbps"]) for p in entry[tool]] for tool in ("harness", "ib_write_bw")}
              for name, entry in report["bandwidth"].items()}
    assert plot_bandwidth(series, tmp_path / "bandwidth.png")
    report["bandwidth_png"] = True
    index = write_index(report, tmp_path)
    img = parse(index.read_text(encoding="utf-8")).find("img", class_="bandwidth")
    prefix = "data:image/png;base64,"
    assert img.attrs["src"].startswith(prefix)
    assert base64.b64decode(img.attrs["src"][len(prefix):]) == (tmp_path / "bandwidth.png").read_bytes()
