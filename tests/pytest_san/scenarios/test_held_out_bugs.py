"""Issue 27's planted bugs, written apart from the shipped corpus, are caught; its legal variants pass.

Each module of ``tests/support/held_out_providers`` wraps the emulator's provider the way an outside author's bug would
(``pytest_san_make_provider``). A bug is run with the conformance scenarios that should catch it, in a subprocess
as an author runs the suite (``-p MODULE --san-report``), and must fail a rule its ``BREAKS`` names, in the
scenario named here; the suite without the bug passes those scenarios (``test_correct_provider_passes_every_rule``),
so the failure is the bug's (the model's run is turned off there: the scenario must catch it). A legal variant
(no ``BREAKS``) runs the whole suite, the reference model included (``test_model.py`` at the suite's budget), and
must fail no rule: neither a scenario nor the model may fail what the contract allows.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import held_out_providers as held_out

pytestmark = pytest.mark.whole_suite  # each case runs the suite in a subprocess: not in tox (tox.ini)

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = held_out.__name__

BUGS = {  # module -> the scenario that must catch it (issue 27's "Why": what the scenarios then missed; and one more)
    "first_entry_only_access_check": "test_access.py::test_write_only_entry_anywhere_in_a_source_list_is_rejected",
    "first_entry_only_range_check":
        "test_bounds.py::test_entry_one_byte_outside_its_registration_anywhere_in_a_list_is_rejected",
    "same_host_foreign_buffer_accepted": "test_access.py::test_registering_another_process_buffer_is_efault",
    "entry_resolved_in_the_callers_address_space":
        "test_access.py::test_scatter_entry_of_another_process_is_rejected",
    "handles_survive_socket_number_reuse":
        "test_lifetime.py::test_registrations_of_a_closed_socket_fail_on_sockets_made_after_it",
    "in_use_mark_cleared_by_the_first":
        "test_lifetime.py::test_a_handle_stays_in_use_until_its_last_pending_operation_completes",
    "descriptor_size_zero_is_no_probe":
        "test_errors.py::test_every_descriptor_size_below_the_required_one_is_the_probe",
    "send_completes_before_a_receive": "test_messages.py::test_send_waits_for_a_receive_and_scatters",
}
LEGAL = ["bad_entry_refused_at_the_call", "single_entry_rdma_read", "shorter_descriptors"]
FAILED = re.compile(r"^FAILED (\S+)", re.MULTILINE)


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, plugin: str, target: str, *,
         model: bool = False) -> tuple[dict[str, Any], list[str], dict[str, int]]:
    """(the report, the failed tests, the outcomes) of ``target`` run with ``plugin``, the model's run on where
    ``model`` says (at the suite's budget and seed) and off otherwise."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    report = pytester.path / "report.json"
    off = [] if model else ["--san-model-sequences", "0"]
    result = pytester.runpytest_subprocess("--pyargs", target, "-p", plugin, *off,
                                           "--san-report", str(report))
    output = result.stdout.str()
    assert report.exists(), output[-3000:]
    return json.loads(report.read_text()), FAILED.findall(output), result.parseoutcomes()


def _failing(rules: dict[str, dict[str, int]]) -> set[str]:
    return {rule for rule, counts in rules.items() if counts["failed"]}


def test_every_held_out_module_is_run_here_and_says_what_it_breaks() -> None:
    names = {info.name for info in pkgutil.iter_modules(held_out.__path__)}
    assert names == set(BUGS) | set(LEGAL)
    for name in names:
        module = importlib.import_module(f"{PACKAGE}.{name}")
        assert bool(getattr(module, "BREAKS", ())) == (name in BUGS), name
        assert module.__doc__ and callable(module.pytest_san_make_provider), name


@pytest.mark.parametrize(("name", "catcher"), sorted(BUGS.items()), ids=sorted(BUGS))
def test_a_held_out_bug_is_caught_under_a_rule_it_breaks(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                         name: str, catcher: str) -> None:
    breaks = set(importlib.import_module(f"{PACKAGE}.{name}").BREAKS)
    scenario_module = "pytest_san.scenarios." + catcher.partition(".py")[0]
    report, failed, _ = _run(pytester, monkeypatch, f"{PACKAGE}.{name}", scenario_module)
    rules = report["rules"]
    assert _failing(rules) & breaks, f"{name} breaks {sorted(breaks)}, the suite failed {sorted(_failing(rules))}"
    function = catcher.partition("::")[2]  # node ids are relative to the run's directory: the name is what is sure
    assert any(test.partition("[")[0].endswith("::" + function) for test in failed), f"{catcher} did not fail: {failed}"


@pytest.mark.parametrize("name", LEGAL)
def test_a_held_out_legal_variant_passes_the_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                   name: str) -> None:
    report, failed, outcomes = _run(pytester, monkeypatch, f"{PACKAGE}.{name}", "pytest_san.scenarios", model=True)
    assert _failing(report["rules"]) == set() and failed == [], failed
    assert outcomes.get("passed", 0) > 200, outcomes
    model = report["model"]  # the model ran, and found nothing the contract forbids
    assert model["sequences"] > 0 and model["divergences"] == [], [d["message"] for d in model["divergences"]]
