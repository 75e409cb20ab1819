"""The controller's record of each host's kernel and its witness's readings (hil/controller/kernel.py): what
lands in the report's "kernel" and "kernel_resources"."""

from __future__ import annotations

from typing import Any

from hil.controller.kernel import KernelLog, merge_records, summarize

WITNESS = {"reader": "netlink", "device": "rxe0", "cap_net_admin": True, "pid": 7, "unavailable": None}


def _reading(at: str, findings: tuple[str, ...] = (), count: int | None = None) -> dict[str, Any]:
    reading: dict[str, Any] = {"at": at, "processes": {"9": {"role": "default", "mr": [[1, 4096]]}},
                               "findings": list(findings)}
    if count is not None:
        reading["count"] = count
    return reading


def test_readings_are_filed_under_the_test_that_made_them() -> None:
    log = KernelLog()
    log.host("lab1", "6.12.117+deb13-amd64", WITNESS, ["rxe-zero-length-read"])
    log.host("lab2", "6.12.117+deb13-amd64", None)
    log.add("lab1", [_reading("before the test's cleanup"), _reading("with the leak check", ("pid 9 holds MR",))])
    log.take("t.py::test_one")
    log.take("t.py::test_two")  # nothing pending: no entry
    log.session_end("lab1", {"at": "at the session's end", "processes": {}, "findings": []})
    assert log.kernels == {"lab1": "6.12.117+deb13-amd64", "lab2": "6.12.117+deb13-amd64"}
    lab1 = log.record["lab1"]
    assert {k: lab1[k] for k in ("reader", "device", "cap_net_admin", "unavailable", "workarounds")} == {
        "reader": "netlink", "device": "rxe0", "cap_net_admin": True, "unavailable": None,
        "workarounds": ["rxe-zero-length-read"]}
    assert [t["nodeid"] for t in lab1["tests"]] == ["t.py::test_one"]
    assert lab1["tests"][0]["findings"] == [{"at": "with the leak check", "finding": "pid 9 holds MR"}]
    assert log.record["lab2"]["unavailable"] == "this host's engine does not read the kernel's RDMA resources"
    assert log.findings() == ["lab1: t.py::test_one: with the leak check: pid 9 holds MR"]


def test_a_summary_counts_what_the_agent_dropped() -> None:
    test = summarize("t.py::test_model", [{"at": "dropped", "count": 40, "processes": {}, "findings": []},
                                          _reading("with the leak check"), _reading("with the leak check")])
    assert test["readings"] == 42 and "dropped" not in test
    assert test["with the leak check"] == {"9": {"role": "default", "mr": [[1, 4096]]}}


def test_workers_records_merge_by_host() -> None:
    mine: dict[str, dict[str, Any]] = {}
    merge_records(mine, {"lab1": {"reader": "netlink", "tests": [{"nodeid": "a"}], "session_end": None}})
    merge_records(mine, {"lab1": {"tests": [{"nodeid": "b"}], "session_end": {"findings": []}},
                         "lab2": {"tests": [], "session_end": None}})
    assert [t["nodeid"] for t in mine["lab1"]["tests"]] == ["a", "b"]
    assert mine["lab1"]["session_end"] == {"findings": []} and mine["lab1"]["reader"] == "netlink"
    assert mine["lab2"] == {"tests": [], "session_end": None}
