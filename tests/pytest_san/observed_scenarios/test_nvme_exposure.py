"""The check that the register_always=N exposure is still found (pytest_san.observed_scenarios.nvme_exposure), on
reports shaped as ``--san-report`` writes them: the real failure's words pass it, anything less names what is
missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_san.observed_scenarios import nvme_exposure

REASON = ("AssertionError: memory past the end of what was advertised was reachable: the rogue target read 64 bytes "
          "at 0xff45864ac157e800 with key 0x8c670, the PD's unsafe global rkey (the SGL asks no invalidation; the "
          "host's kernel: 'nvme_rdma: enabling unsafe global rkey'); bytes read: af4bc1adffffffff")


def report(**changes: dict[str, Any]) -> dict[str, Any]:
    tests = [{"nodeid": f"test_nvme_rdma.py::{name}", "rules": list(rules), "outcome": "failed", "reason": REASON}
             for name, rules in nvme_exposure.EXPECTED.items()]
    for test in tests:
        test.update(changes.get(test["nodeid"].rsplit("::", 1)[1], {}))
    return {"tests": tests}


def test_the_exposure_as_found_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert nvme_exposure.missing(report()) == []
    path = tmp_path / "n.json"
    path.write_text(json.dumps(report()))
    assert nvme_exposure.main([str(path)]) == 0
    assert "the unsafe global rkey was found" in capsys.readouterr().out


@pytest.mark.parametrize(("change", "said"), [
    ({"outcome": "passed"}, "passed, it should fail"),
    ({"outcome": "skipped"}, "skipped, it should fail"),
    ({"rules": ["R8"]}, "failed under ['R8'], not R5, R8"),
    ({"reason": "AssertionError: a key of this request; bytes read: 00"}, "does not name the unsafe global rkey"),
    ({"reason": "the PD's unsafe global rkey; bytes read: (none)"}, "shows no bytes read"),
])
def test_anything_less_is_named(change: dict[str, Any], said: str) -> None:
    problems = nvme_exposure.missing(report(test_a_peer_cannot_read_past_what_the_host_advertised=change))
    assert len(problems) == 1 and said in problems[0]


def test_a_scenario_that_did_not_run_and_an_unreadable_report(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert nvme_exposure.missing({"tests": []}) == [f"{name} did not run" for name in nvme_exposure.EXPECTED]
    assert nvme_exposure.main([str(tmp_path / "absent.json")]) == 1
    assert "cannot read" in capsys.readouterr().err
