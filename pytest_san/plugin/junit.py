"""The rules in pytest's JUnit XML (``--junitxml``), so that a CI dashboard can filter by rule (CONTRACT.md 5.1).

- ``junit_family = xunit1`` (or ``legacy``): each SAN test's ``<testcase>`` carries one
  ``<property name="san_rule" value="R6"/>`` per rule it checks (R11 too when its teardown found a leak) and
  ``<property name="san_backend" value="..."/>``.
- ``xunit2``, pytest's default, has no per-test properties: the ``<testsuite>`` carries one ``san_rules``
  property, JSON ``{test id: [rule ids]}``, and ``san_backend``. No warning is raised (``record_property``
  would raise one under xunit2; nothing here uses it), and the round trips the hil backend records on each
  test (``san_round_trips``, a user property) are left out of it.
- A test that failed as a declared deviation says so (``san_deviation``, xunit1); under xunit2 the suite carries
  ``san_deviations``, the report's ``"deviations"`` as JSON. pytest itself writes such a test as skipped
  (``pytest.xfail``) with the deviation as its message. The known differences (workarounds, alternatives) belong
  to no test: under xunit1 the suite carries them as ``san_deviations`` (xunit2: in the same list).
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any

import pytest

from ..report import catalog_order, leak_rules
from .deviations import DEVIATED_KEY, verdict_dicts
from .fixtures import ROUND_TRIPS_PROPERTY
from .hooks import LEAKS_KEY, REPORT_KEY, backend_name, is_san_test, marker_args

PER_TEST_FAMILIES = ("xunit1", "legacy")


def _family(config: pytest.Config) -> str | None:
    """The JUnit family when this process writes a JUnit file (an xdist worker does not), else None."""
    if not config.getoption("xmlpath", None) or hasattr(config, "workerinput"):
        return None
    return str(config.getini("junit_family"))


def _backend(config: pytest.Config) -> str:
    report = config.stash.get(REPORT_KEY, None)
    return report.backend if report is not None and report.backend else backend_name(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    # xunit1 reads the teardown report's user_properties; an xdist worker ships them to the controller.
    config = item.config
    junit = config.getoption("xmlpath", None)
    per_test = junit and config.getini("junit_family") in PER_TEST_FAMILIES
    if call.when == "teardown" and junit and not per_test:
        # pytest writes a teardown report's user_properties into any family; xunit2 has no per-test properties.
        report.user_properties = [p for p in report.user_properties if p[0] != ROUND_TRIPS_PROPERTY]
    if call.when == "teardown" and per_test and is_san_test(item):
        rules = [str(rule) for rule in marker_args(item, "san_rule")]
        leaks: list[str] = item.stash.get(LEAKS_KEY, [])
        rules += leak_rules(leaks)
        report.user_properties += [("san_rule", rule) for rule in catalog_order(rules)]
        report.user_properties.append(("san_backend", _backend(config)))
        if DEVIATED_KEY in item.stash:
            report.user_properties.append(("san_deviation", item.stash[DEVIATED_KEY]))
    return report


def _log_xml(config: pytest.Config) -> Any:
    """pytest's JUnit writer (its LogXML), which holds the suite-level properties."""
    from _pytest import junitxml

    return config.stash.get(junitxml.xml_key, None)


@pytest.hookimpl(tryfirst=True)  # before the JUnit writer's own pytest_sessionfinish writes the file
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    family = _family(config)
    report = config.stash.get(REPORT_KEY, None)
    xml = _log_xml(config) if family is not None else None
    if xml is None or report is None or not report.tests:
        return
    deviations = report.deviations or verdict_dicts(config)  # an xdist controller has its workers'
    if family in PER_TEST_FAMILIES:  # a declared deviation is on its tests; what belongs to none, on the suite
        known = [entry for entry in deviations if entry.get("kind", "declared") != "declared"]
        if known:
            xml.add_global_property("san_deviations", json.dumps(known, separators=(",", ":")))
        return
    rules = {test.nodeid: list(test.rules) for test in report.tests}
    xml.add_global_property("san_rules", json.dumps(rules, separators=(",", ":")))
    xml.add_global_property("san_backend", _backend(config))
    if deviations:
        xml.add_global_property("san_deviations", json.dumps(deviations, separators=(",", ":")))
