"""Declared deviations in the verdict (pytest_san.deviations): a test that fails as declared is ``deviating``
(pytest shows it xfailed), one that passes though declared fails as a strict xfail would; the report lists
every declared deviation with whether it was observed.

Beside them it lists the other known differences, which decide no test's outcome: the kernel workarounds
the backend's hosts apply (a backend that ``ReportsDifferences``: the hil backend) and, once the model ran,
the documented alternatives in effect for the backend it judged, observed when the model expected one at a
step (the alternatives change only what the model expects: no scenario reads them)."""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterable
from typing import Any, cast

import pytest

from ..deviations import Deviation, deviations_of, differences_of
from ..report import ConformanceReport, catalog_order
from .hooks import DEVIATION_ATTR, REPORT_KEY, created_backend, is_san_test, marker_args

DECLARED_KEY = pytest.StashKey[dict[Deviation, bool]]()
"""Every declared deviation -> whether a test observed it (set once the backend is built)."""
DEVIATED_KEY = pytest.StashKey[str]()
"""On an item that failed as declared: the deviations that declared it (for the JUnit XML)."""


def declared(config: pytest.Config) -> dict[Deviation, bool]:
    """The declared deviations, asked once the backend exists (none before)."""
    found = config.stash.get(DECLARED_KEY, None)
    if found is not None:
        return found
    backend = created_backend(config)
    if backend is None:
        return {}
    answers = cast("list[Iterable[Deviation] | None]", config.hook.pytest_san_deviations(config=config,
                                                                                          backend=backend))
    try:
        entries = [*itertools.chain.from_iterable(a for a in answers if a is not None), *deviations_of(backend)]
        differences_of(backend)  # checked now, with the declarations; listed at the session's end
    except TypeError as exc:
        raise pytest.UsageError(str(exc)) from None
    for entry in entries:
        if not isinstance(entry, Deviation) or entry.kind != "declared":
            raise pytest.UsageError(f"pytest_san_deviations gave {entry!r}, not a pytest_san.Deviation "
                                    "it declares")
    found = config.stash[DECLARED_KEY] = dict.fromkeys(entries, False)
    return found


def _describe(entries: Iterable[Deviation]) -> str:
    return "; ".join(f"{d.rule} by {d.implementation} ({d.why}): {d.what}" for d in entries)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    if call.when != "call" or not is_san_test(item) or getattr(report, "wasxfail", None) is not None:
        return report
    table = declared(item.config)
    rules = catalog_order(str(arg) for arg in marker_args(item, "san_rule"))
    mine = [d for d in table if d.explains(item.nodeid, rules)]
    if not mine:
        return report
    if report.failed:
        for entry in mine:
            table[entry] = True
        report.outcome = "skipped"
        report.wasxfail = f"declared deviation: {_describe(mine)}"
        vars(report)[DEVIATION_ATTR] = item.stash[DEVIATED_KEY] = _describe(mine)
    elif report.passed:
        report.outcome = "failed"
        report.longrepr = f"[declared deviation not observed] the test passed: {_describe(mine)}"
    return report


def declared_dicts(config: pytest.Config) -> list[dict[str, Any]]:
    """The declared deviations as the report's ``"deviations"`` holds them."""
    return [entry.to_dict(observed) for entry, observed in config.stash.get(DECLARED_KEY, {}).items()]


def known_dicts(config: pytest.Config, report: ConformanceReport | None) -> list[dict[str, Any]]:
    """The workarounds the backend applies (each observed: applied on the hosts named) and, when ``report``
    holds a model run, the alternatives in effect for the capabilities every node has (observed: the model
    expected it at one step at least)."""
    backend = created_backend(config)
    try:
        entries = [entry.to_dict(True) for entry in differences_of(backend)]
    except TypeError:  # said already, when the first test ended (``declared``)
        entries = []
    if report is not None and report.model is not None:
        from ..known_differences import alternatives_in_effect  # imports the model, which ran already

        met = report.model.alternatives
        entries += [alt.to_dict(met.get(alt.name or "", 0) > 0) for alt in alternatives_in_effect(report.capabilities)]
    return entries


def verdict_dicts(config: pytest.Config) -> list[dict[str, Any]]:
    """The report's ``"deviations"``: the declared ones, then the known differences."""
    return declared_dicts(config) + known_dicts(config, config.stash.get(REPORT_KEY, None))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Before the report is written (hooks.py's sessionfinish runs last): the declared deviations, observed
    or not, and the known differences into the conformance report (an xdist controller has its workers'
    already: merging again adds nothing)."""
    report = session.config.stash.get(REPORT_KEY, None)
    if report is not None:
        report.merge_deviations(verdict_dicts(session.config))
