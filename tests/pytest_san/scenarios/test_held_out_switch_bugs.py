"""Issue 30's held-out switch bugs, written from the docs alone, are caught; its legal switches pass.

Each module of ``tests/support/held_out_switches`` is a switch an outside author might write over the example
switch, plugged in through ``pytest_san_make_switch``. A bug is run as an author runs the suite (a subprocess,
``-p MODULE --san-report``) on the scenario that should catch it (to its first failure), with ``--san-rules`` its
``BREAKS``, and must fail a rule its ``BREAKS`` names in that scenario (the example switch, which these bugs change in
one place, passes the whole suite: ``switch/test_hook.py`` and ``switch_simple`` in the corpus). The model's run is
off throughout: it judges the provider, not the switch. A legal switch (no ``BREAKS``) runs the whole suite and
must fail nothing.

``auto_asks_the_senders_provider`` needs nodes whose providers differ (``tests/support/one_node_without_rdma_read``):
over identical providers nothing tells the receiving end's capability from the sending end's.
``first_region_left_when_the_second_fails`` was a strict xfail until issue 37: the connect that fails closes its
socket, and the provider releases every registration of a closed socket, so no protocol showed the region the switch
left. The scenario now makes the switch over a backend that writes down each provider call made through it
(``pytest_san/scenarios/watching.py``) and reads R11's first clause from those calls.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support import held_out_switches

pytestmark = pytest.mark.whole_suite  # each case runs the suite in a subprocess: not in tox (tox.ini)

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = held_out_switches.__name__
MIXED = "tests.support.one_node_without_rdma_read"

BUGS = {  # module -> the scenario that must catch it
    "ring_one_receive_short": "test_switch_flow.py::test_a_window_of_held_completions_is_used_and_returned_whole",
    "stale_handle_for_the_next_write": "test_switch_stream.py::test_every_length_arrives_once_in_order_both_ways",
    "auto_asks_the_senders_provider": "test_switch.py::test_auto_mode_follows_the_peer_capability",
    "write_sink_registered_read_only":
        "test_switch.py::test_large_transfer_moves_by_rdma_write_when_peer_lacks_read",
    "closes_one_end_only": "test_switch.py::test_close_releases_everything",
    "threshold_in_message_slots":
        "test_switch_connect.py::test_exactly_the_sends_above_the_threshold_move_by_rdma",
    "last_byte_of_a_full_message_lost": "test_switch_flow.py::test_messages_never_outrun_the_receives_posted_for_them",
    "read_source_released_at_send": "test_switch.py::test_large_transfer_moves_by_rdma_read",
    "read_source_exposed_readwrite":
        "test_switch_exposure.py::test_a_large_transfer_exposes_one_descriptor_of_its_direction_only",
    "descriptor_kept_after_its_transfer":
        "test_switch_exposure.py::test_a_large_transfer_exposes_one_descriptor_of_its_direction_only",
    "rdma_remainder_dropped": "test_switch_stream.py::test_every_length_arrives_once_in_order_both_ways",
    "second_close_asks_again": "test_switch_stream_close.py::test_close_at_any_stage_of_a_transfer",
    "asked_threshold_ignored": "test_switch_connect.py::test_a_mode_asked_for_is_the_mode_used",
    "first_region_left_when_the_second_fails":
        "test_switch_connect.py::test_a_connect_refused_at_any_registration_releases_everything",
}
PLUGINS = {"auto_asks_the_senders_provider": [MIXED]}
"""Plugins a bug runs with besides its own."""
ONLY = {"last_byte_of_a_full_message_lost": ["[0]", "[3]"]}
"""Cases of the catcher to run instead of its module: the others wait 30 s each for bytes the bug lost."""
LEGAL = ["small_rdma_pieces", "power_of_two_ring", "eager_credit_returns"]
FAILED = re.compile(r"^FAILED (\S+)", re.MULTILINE)


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, plugins: list[str], targets: list[str],
         *options: str) -> tuple[dict[str, Any], list[str], dict[str, int]]:
    """(the report, the failed tests, the outcomes) of ``targets`` run with ``plugins``, the model's run off."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    report = pytester.path / "report.json"
    loaded = [arg for plugin in plugins for arg in ("-p", plugin)]
    result = pytester.runpytest_subprocess("--pyargs", *targets, *loaded,
                                           "--san-model-sequences", "0", "--san-report", str(report), *options)
    output = result.stdout.str()
    assert report.exists(), output[-3000:]
    return json.loads(report.read_text()), FAILED.findall(output), result.parseoutcomes()


def _failing(rules: dict[str, dict[str, int]]) -> set[str]:
    return {rule for rule, counts in rules.items() if counts["failed"]}


def test_every_held_out_switch_is_run_here_and_says_what_it_breaks() -> None:
    names = {info.name for info in pkgutil.iter_modules(held_out_switches.__path__)}
    assert names == set(BUGS) | set(LEGAL)
    for name in names:
        module = importlib.import_module(f"{PACKAGE}.{name}")
        breaks = getattr(module, "BREAKS", ())
        assert bool(breaks) == (name in BUGS), name
        assert module.__doc__ and callable(module.pytest_san_make_switch), name
        assert all(re.search(rf"\b{rule}\b", module.__doc__) for rule in breaks), f"{name}'s docstring: {breaks}"


@pytest.mark.parametrize(("name", "catcher"), sorted(BUGS.items()), ids=sorted(BUGS))
def test_a_held_out_switch_bug_is_caught_under_a_rule_it_breaks(pytester: pytest.Pytester,
                                                                monkeypatch: pytest.MonkeyPatch, name: str,
                                                                catcher: str) -> None:
    breaks = set(importlib.import_module(f"{PACKAGE}.{name}").BREAKS)
    module = "pytest_san.scenarios." + catcher.partition(".py")[0]
    function = catcher.partition("::")[2]
    # The catcher alone, to its first failure (-x): a bug that loses bytes makes every later case wait out its
    # 30 s timeout (rdma_remainder_dropped's module took over 15 minutes on a loaded machine).
    targets = [f"{module}::{function}{case}" for case in ONLY.get(name, [""])]
    report, failed, _ = _run(pytester, monkeypatch, [*PLUGINS.get(name, []), f"{PACKAGE}.{name}"], targets,
                             "--san-rules", ",".join(sorted(breaks)), "-x")
    rules = report["rules"]
    assert _failing(rules) & breaks, f"{name} breaks {sorted(breaks)}, the suite failed {sorted(_failing(rules))}"
    # node ids are relative to the run's directory: the name is what is sure
    assert any(test.partition("[")[0].endswith("::" + function) for test in failed), f"{catcher} did not fail: {failed}"


@pytest.mark.parametrize("switch", [None, "pytest_san.examples.simple_switch"], ids=["pytest-san's", "example"])
def test_switches_without_the_bug_pass_r10_over_nodes_that_differ(pytester: pytest.Pytester,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   switch: str | None) -> None:
    """The mixed nodes are a legal setup: what fails over them is the switch's."""
    report, failed, outcomes = _run(pytester, monkeypatch, [MIXED, *([switch] if switch else [])],
                                    ["pytest_san.scenarios"], "--san-rules", "R10")
    assert _failing(report["rules"]) == set() and failed == [], failed
    assert outcomes.get("passed", 0) > 40 and outcomes.get("skipped", 0) > 0, outcomes  # RdmaRead toward node1


@pytest.mark.parametrize("name", LEGAL)
def test_a_held_out_legal_switch_passes_the_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                  name: str) -> None:
    report, failed, outcomes = _run(pytester, monkeypatch, [f"{PACKAGE}.{name}"], ["pytest_san.scenarios"])
    assert _failing(report["rules"]) == set() and failed == [], failed
    assert outcomes.get("passed", 0) > 200, outcomes
