"""The reference model in the verdict (issue 27): ``pytest --pyargs pytest_san.scenarios`` runs it, one test per
rule it checks, each failing only when a divergence breaks its rule (pytest_san/plugin/model.py,
pytest_san/scenarios/test_model.py), and which rules a divergence breaks (pytest_san/model/rules.py)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

import pytest_san.model.test_model as deep
import pytest_san.scenarios.test_model as suite
from pytest_san.model.execute import Problem
from pytest_san.model.reference import Model
from pytest_san.model.rules import MODEL_RULES, broken_rules
from pytest_san.model.state import Traits
from pytest_san.model.steps import Close, Deregister, Key, Register, Step, Transfer, plan_for
from pytest_san.spi.contract import Access

R, W, RW = int(Access.READ), int(Access.WRITE), int(Access.READWRITE)
MODEL_TESTS = "test_the_model_finds_no_divergence_breaking"
SMALL = ["--san-model-sequences=20", "--san-model-steps=20"]


def test_the_suite_has_a_test_for_each_rule_the_model_checks() -> None:
    assert suite.MODEL_RULES == MODEL_RULES == deep.RULES


def _report(pytester: pytest.Pytester, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((pytester.path / name).read_text())
    return data


def test_the_main_job_runs_the_model_one_test_per_rule(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--pyargs", "pytest_san.scenarios", "-k",
                                           MODEL_TESTS, *SMALL, "--san-report=r.json", "-v")
    result.assert_outcomes(passed=len(MODEL_RULES))
    result.stdout.fnmatch_lines([f"*test_model.py::{MODEL_TESTS}[[]{rule}[]] PASSED*" for rule in MODEL_RULES])
    result.stdout.fnmatch_lines(["*model on emulator: 20 sequences, 400 steps, * 0 divergence(s); seed 1 *"])
    data = _report(pytester, "r.json")
    assert {rule: counts["passed"] for rule, counts in data["rules"].items() if counts["passed"]} == dict.fromkeys(
        MODEL_RULES, 1)
    assert data["model"]["sequences"] == 20 and data["model"]["divergences"] == []


def test_a_divergence_counts_under_the_rule_it_breaks(pytester: pytest.Pytester) -> None:
    """A provider whose READ handles are writable (the corpus's read_handle_writable, breaking R6): only the R6
    test fails, in the table, the JSON and the JUnit properties."""
    result = pytester.runpytest_subprocess("--pyargs", "pytest_san.scenarios", "-k",
                                           MODEL_TESTS, "-p", "pytest_san.mutants.bugs.read_handle_writable",
                                           *SMALL, "--san-report=r.json", "--junitxml=j.xml",
                                           "-o", "junit_family=xunit1")
    result.assert_outcomes(passed=len(MODEL_RULES) - 1, failed=1)
    result.stdout.fnmatch_lines(["*breaking R6 *", f"FAILED *{MODEL_TESTS}[[]R6[]]*"])
    result.stdout.re_match_lines([r"^R6 +0 +1 +0 +0$", r"^R7 +1 +0 +0 +0$"])
    data = _report(pytester, "r.json")
    assert {rule for rule, counts in data["rules"].items() if counts["failed"]} == {"R6"}
    assert data["model"]["divergences"] and all(d["rules"] == ["R6"] for d in data["model"]["divergences"])

    cases = {case.get("name"): case for case in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")}
    failed = cases[f"{MODEL_TESTS}[R6]"]
    assert failed.find("failure") is not None
    assert [p.get("value") for p in failed.iter("property") if p.get("name") == "san_rule"] == ["R6"]
    passed = cases[f"{MODEL_TESTS}[R7]"]
    assert passed.find("failure") is None
    assert [p.get("value") for p in passed.iter("property") if p.get("name") == "san_rule"] == ["R7"]


def test_zero_sequences_leave_the_model_out(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--pyargs", "pytest_san.scenarios",
                                           "--san-model-sequences=0", "--san-report=r.json")
    outcomes = result.parseoutcomes()
    assert outcomes["deselected"] == len(MODEL_RULES) and outcomes["passed"] > 200 and "failed" not in outcomes
    assert "model" not in _report(pytester, "r.json")


BUDGETED = """
    from pytest_san.spi.emulator import EmulatorBackend
    from pytest_san.spi.protocols import ModelBudget


    class Budgeted(EmulatorBackend):
        def model_budget(self):
            return ModelBudget(sequences=3, steps=5)


    def pytest_san_backend_names(config):
        return ["budgeted"]


    def pytest_san_make_backend(config, name):
        return Budgeted() if name == "budgeted" else None
"""


def test_the_budget_is_the_backends_unless_the_options_say(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(BUDGETED)
    args = ["--pyargs", "pytest_san.scenarios", "-k", MODEL_TESTS, "--san-report=r.json"]
    pytester.runpytest_subprocess(*args, "--san-backend=budgeted").assert_outcomes(passed=len(MODEL_RULES))
    model = _report(pytester, "r.json")["model"]
    assert (model["sequences"], model["steps"]) == (3, 15)
    pytester.runpytest_subprocess(*args, "--san-backend=budgeted", "--san-model-sequences=2").assert_outcomes(
        passed=len(MODEL_RULES))
    model = _report(pytester, "r.json")["model"]
    assert (model["sequences"], model["steps"]) == (2, 10)
    # The emulator's own budget; its 10 s deadline only bounds a wrong provider's shrinking, and on a loaded
    # machine it cut this run at 97 sequences, so a deadline no load reaches stands in for it here.
    pytester.runpytest_subprocess(*args, "--san-model-deadline=3600").assert_outcomes(passed=len(MODEL_RULES))
    model = _report(pytester, "r.json")["model"]
    assert (model["sequences"], model["steps"], model["seeds"]) == (100, 4000, [1])


# -- which rules a divergence breaks ------------------------------------------------------------------

PLAN = plan_for(2)  # slot 0: s0 (p0, node 0) - s1 (p2, node 1)


def _rules(problem: Problem, steps: list[Step], index: int | None = None) -> tuple[str, ...]:
    return broken_rules(problem, steps, len(steps) - 1 if index is None else index,
                        lambda: Model(PLAN, Traits(desc_size=20)))


def _went_through(op: int, nbytes: int, expected: str) -> Problem:
    return Problem("completion", f"operation op#{op}: SUCCESS {nbytes} bytes, expected {expected}")


def test_an_rdma_write_that_went_through_breaks_each_fault_it_has() -> None:
    window = Register(1, "rdma", (2, 0, 0, 16), R, reg=1)  # the peer's READ window of 16 bytes
    source = Register(0, "memory", (0, 0, 0, 32), R, reg=2)
    into_read = Transfer(0, "rdma_write", (((0, 0, 0, 16), Key(reg=2)),), op=1, desc=Key(reg=1))
    assert _rules(_went_through(1, 16, "ACCESS_VIOLATION"), [window, source, into_read]) == ("R6",)
    past_end = Transfer(0, "rdma_write", (((0, 0, 0, 16), Key(reg=2)),), op=1, desc=Key(reg=1), offset=8)
    assert _rules(_went_through(1, 16, "ACCESS_VIOLATION"), [window, source, past_end]) == ("R6", "R8")
    stale: list[Step] = [window, source, Deregister(1, "rdma", Key(reg=1)), into_read]
    assert _rules(_went_through(1, 16, "ACCESS_VIOLATION"), stale) == ("R3",)


def test_a_source_list_checked_on_its_first_entry_only_breaks_r7() -> None:
    good = Register(0, "memory", (0, 0, 0, 16), R, reg=1)
    write_only = Register(0, "memory", (0, 1, 0, 16), W, reg=2)
    recv = Register(1, "memory", (2, 0, 0, 64), W, reg=3)
    steps: list[Step] = [good, write_only, recv, Transfer(1, "recv", (((2, 0, 0, 64), Key(reg=3)),), op=1),
                         Transfer(0, "send", (((0, 0, 0, 16), Key(reg=1)), ((0, 1, 0, 16), Key(reg=2))), op=2)]
    assert _rules(_went_through(2, 32, "LOCAL_PROTECTION"), steps) == ("R7",)
    # ... and a handle of another socket (slot 1's s2, the same process) in its place breaks R1
    steps[1] = Register(2, "memory", (0, 1, 0, 16), RW, reg=2)
    assert _rules(_went_through(2, 32, "LOCAL_PROTECTION"), steps) == ("R1",)


def test_a_transfer_left_pending_where_it_must_be_refused_breaks_its_faults_rules() -> None:
    steps: list[Step] = [Register(0, "memory", (0, 0, 0, 64), RW, reg=1),
                         Transfer(0, "recv", (((0, 1, 6, 16), Key(reg=1)), ((0, 0, 0, 64), Key(reg=1))), op=1)]
    problem = Problem("completion", "operation of step op#1: still pending, expected LOCAL_PROTECTION")
    assert _rules(problem, steps) == ("R8",)  # its first entry is outside the registration


def test_a_registration_listed_after_a_transfer_breaks_r1() -> None:
    steps: list[Step] = [Register(0, "memory", (0, 1, 30, 9), W, reg=1),
                         Transfer(0, "send", (((0, 0, 33, 13), Key(reg=1)),), op=1)]
    message = ("registrations of s0: the provider has [('memory', 4129, 13, 2, 1), ('memory', 4190, 9, 2, 1)], "
               "the model [('memory', 4190, 9, 2, 1)]")
    assert _rules(Problem("registrations", message), steps) == ("R1",)


def test_a_deregistration_accepted_in_use_breaks_r13() -> None:
    steps: list[Step] = [Register(0, "memory", (0, 1, 11, 24), W, reg=1),
                         Transfer(0, "recv", (((0, 1, 11, 24), Key(reg=1)),), op=1),
                         Deregister(0, "memory", Key(reg=1))]
    assert _rules(Problem("call", "answered done, expected WSAEINVAL"), steps) == ("R13",)
    assert _rules(Problem("call", "answered WSAEFAULT, expected WSAEINVAL"), steps) == ("R14",)


def test_registrations_with_more_access_than_asked_break_r6_or_r7() -> None:
    steps: list[Step] = [Register(0, "rdma", (0, 1, 19, 18), W, reg=1)]
    message = ("registrations of s0: the provider has [('rdma', 4096, 18, {}, 1)], "
               "the model [('rdma', 4096, 18, {}, 1)]")
    assert _rules(Problem("registrations", message.format(RW, W)), steps) == ("R7",)
    assert _rules(Problem("registrations", message.format(RW, R)), steps) == ("R6",)
    assert _rules(Problem("registrations", message.format(W, W).replace("1)], the", "2)], the")), steps) == ("R13",)
    # two registrations of one range (WRITE, then READ), the READ one writable: R6 alone, not R7 for the other
    two = ("registrations of s0: the provider has [('rdma', 4096, 64, 2, 1), ('rdma', 4096, 64, 3, 1)], "
           "the model [('rdma', 4096, 64, 1, 1), ('rdma', 4096, 64, 2, 1)]")
    assert _rules(Problem("registrations", two), steps) == ("R6",)
    gone = ("registrations of s0: the provider has [('rdma', 4096, 64, 1, 1)], "
            "the model [('rdma', 4096, 64, 1, 1), ('rdma', 4096, 64, 2, 1)]")
    assert _rules(Problem("registrations", gone), steps) == ("R13",)  # released too early


def test_a_registration_of_another_process_buffer_breaks_r1_and_r5() -> None:
    steps: list[Step] = [Register(0, "memory", (1, 0, 0, 8), R, reg=1)]  # p1's buffer on p0's socket
    assert _rules(Problem("call", "answered handle, expected WSAEFAULT"), steps) == ("R1", "R5")
    assert _rules(Problem("call", "answered WSAEINVAL, expected WSAEFAULT"), steps) == ("R14",)


def test_pins_left_by_a_close_break_r11() -> None:
    steps: list[Step] = [Register(0, "memory", (0, 0, 0, 8), R, reg=1), Close(0)]
    assert _rules(Problem("proxy", "proxy of node 0: 1 live allocations, the model has 0"), steps) == ("R11",)


@pytest.mark.parametrize(("category", "rule"), [("leaks", "R11"), ("proxy", "R12"), ("state", "R4"),
                                                ("probe", "R14"), ("pending", "R14"), ("crash", "R14")])
def test_what_the_checks_found_breaks_its_rule(category: str, rule: str) -> None:
    assert _rules(Problem(category, "..."), [Register(0, "memory", (0, 0, 0, 8), R, reg=1)], index=0) == (rule,)


def test_each_rules_model_test_shows_its_divergences_in_pytest_html(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_html", reason="pytest-html is not installed (the test extra has it)")
    from tests.pytest_san.plugin.test_html_report import report_data

    result = pytester.runpytest_subprocess("--pyargs", "pytest_san.scenarios", "-k",
                                           MODEL_TESTS, "-p", "pytest_san.mutants.bugs.read_handle_writable",
                                           *SMALL, "--html=report.html")
    result.assert_outcomes(passed=len(MODEL_RULES) - 1, failed=1)
    tests = report_data(pytester.path / "report.html")["tests"]

    def extra(rule: str) -> str:
        (row,) = next(rows for test, rows in tests.items() if test.endswith(f"::{MODEL_TESTS}[{rule}]"))
        (found,) = [e["content"] for e in row["extras"] if e["name"] == "SAN model"]
        return str(found)

    assert 'data-verdict="diverged"' in extra("R6") and re.search(r"divergence\(s\) breaking R6 in \d+ sequence",
                                                                  extra("R6"))
    assert '<p class="san-divergence">divergence 1 of ' in extra("R6") and ", breaking R6</p>" in extra("R6")
    assert 'data-verdict="passed"' in extra("R7") and "no divergence breaking R7" in extra("R7")


def test_the_key_of_a_wider_registration_of_the_same_range_breaks_what_it_widens() -> None:
    first = Register(1, "memory", (2, 1, 0, 40), RW, reg=1)
    problem = Problem("key", "returned 52, already the key of another live registration")
    assert _rules(problem, [first, Register(1, "memory", (2, 1, 0, 40), W, reg=2)]) == ("R7",)
    assert _rules(problem, [first, Register(1, "memory", (2, 1, 0, 40), R, reg=2)]) == ("R6",)
    assert _rules(problem, [first, Register(1, "memory", (2, 1, 1, 8), R, reg=2)]) == ("R13",)
