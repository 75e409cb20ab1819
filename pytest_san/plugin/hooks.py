"""pytest-san's hook implementations: options, markers, capability skips, the conformance report.

All state lives in ``config.stash`` (one pytest run may host several sessions, e.g. under
pytester), never in module globals.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from ..report import ConformanceReport, ModelResult, Outcome, catalog_order, is_rule_id, leak_rules, worse
from .backends import backend_entry_points, load_backend_plugin, make_backend
from .capabilities import common, every_node, missing_reason, note_replacement
from .options import DEFAULT_BACKEND

if TYPE_CHECKING:
    from ..spi.protocols import Backend, Node, Provider, Proxy

SAN_FIXTURES = frozenset({"san_backend", "san_switch", "san_provider", "san_proxy"})
"""Using any of these (directly or through another fixture) makes a test a SAN test."""

BACKEND_KEY = pytest.StashKey["Backend"]()
REPORT_KEY = pytest.StashKey[ConformanceReport]()
PENDING_KEY = pytest.StashKey[dict[str, "_Tally"]]()
LEAKS_KEY = pytest.StashKey[list[str]]()
"""On an item: the leaks its leak check found (read when its teardown report is made)."""

# Attributes set on TestReport objects of SAN tests; plain lists so pytest-xdist can ship them.
_RULES_ATTR = "san_rules"
_LEAKS_ATTR = "san_leaks"
DEVIATION_ATTR = "san_deviation"  # the declared deviations a failure was (plugin/deviations.py)
_RECORDER = "san-report-recorder"


# --- markers and the backend's plugin -------------------------------------------------------

@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Registered here so --strict-markers accepts them.
    config.addinivalue_line("markers", "san_rule(*ids): conformance rules (R1..R14, P1..P5) this test "
                                       "checks; its outcome is counted for each in the SAN report")
    config.addinivalue_line("markers", "san_requires(*capabilities): skip unless every node the test uses has "
                                       "every capability named")
    config.addinivalue_line("markers", "san_nodes(n): the test uses the backend's first n nodes (default: the "
                                       "first two with san_switch or san_backend, else the first)")
    if config.getoption("san_labgrid", None) and backend_name(config) != "hil":
        raise pytest.UsageError(f"--san-labgrid chooses lab hosts for --san-backend=hil, not {backend_name(config)}")
    load_backend_plugin(config, backend_name(config))  # before other plugins configure: it may add hooks
    config.stash[REPORT_KEY] = ConformanceReport(backend_name(config))
    config.stash[PENDING_KEY] = {}
    config.pluginmanager.register(ReportRecorder(config), _RECORDER)


def pytest_unconfigure(config: pytest.Config) -> None:
    recorder = config.pluginmanager.get_plugin(_RECORDER)
    if recorder is not None:
        config.pluginmanager.unregister(recorder)


def pytest_report_header(config: pytest.Config) -> str:
    return f"san backend: {backend_name(config)}"


# --- the backend ----------------------------------------------------------------------------

def backend_name(config: pytest.Config) -> str:
    """``--san-backend``, else ``$SAN_BACKEND``, else hil with ``--san-labgrid``, else the ``san_backend`` ini
    key, else the emulator."""
    name = config.getoption("san_backend") or os.environ.get("SAN_BACKEND")
    if not name and config.getoption("san_labgrid", None):
        return "hil"
    return str(name) if name else str(config.getini("san_backend") or DEFAULT_BACKEND)


def known_backends(config: pytest.Config) -> list[str]:
    names = config.hook.pytest_san_backend_names(config=config)
    return sorted(set(itertools.chain.from_iterable(cast("list[Iterable[str]]", names))))


def _unknown_backend(config: pytest.Config, name: str) -> pytest.UsageError:
    names = known_backends(config)
    known = ", ".join(repr(n) for n in names) or "(none)"
    if name in names:  # declared by pytest_san_backend_names, yet no pytest_san_make_backend built it
        return pytest.UsageError(f"no plugin built SAN backend {name!r}; known backends: {known}")
    return pytest.UsageError(f"unknown SAN backend {name!r} (--san-backend / SAN_BACKEND / ini san_backend); "
                             f"known backends: {known}")


def created_backend(config: pytest.Config) -> Backend | None:
    """The session's backend if something already needed it, else None (never builds it)."""
    return config.stash.get(BACKEND_KEY, None)


def get_backend(config: pytest.Config) -> Backend:
    """The session's backend, built on first use through ``pytest_san_make_backend``."""
    backend = created_backend(config)
    if backend is None:
        name = backend_name(config)
        made = make_backend(config, name)  # a failure: one short error, then the session stops
        if made is None:
            raise _unknown_backend(config, name)
        backend = cast("Backend", made)
        config.stash[BACKEND_KEY] = backend
        report = config.stash[REPORT_KEY]
        report.backend = backend.name
        report.node_capabilities = {name: set(caps) for name, caps in every_node(config, backend).items()}
        report.capabilities = set(common(map(frozenset, report.node_capabilities.values())))
    return backend


def pytest_san_backend_names(config: pytest.Config) -> list[str]:
    return [DEFAULT_BACKEND, *backend_entry_points()]


@pytest.hookimpl(trylast=True)
def pytest_san_make_backend(config: pytest.Config, name: str) -> Backend | None:
    if name != DEFAULT_BACKEND:
        raise _unknown_backend(config, name)
    from ..spi.emulator import EmulatorBackend  # imported late: loading the plugin stays cheap

    wrap_provider, wrap_proxy = wrappers(config)
    return EmulatorBackend(wrap_provider=wrap_provider, wrap_proxy=wrap_proxy)


def wrappers(config: pytest.Config) -> tuple[Callable[[Node, Provider], Provider], Callable[[Node, Proxy], Proxy]]:
    """(provider, proxy) wrappers that ask ``pytest_san_make_provider`` / ``pytest_san_make_proxy``:
    what a backend applies to each node's provider and proxy as it builds them."""

    def wrap_proxy(node: Node, proxy: Proxy) -> Proxy:
        made = config.hook.pytest_san_make_proxy(config=config, node=node, proxy=proxy)
        note_replacement(config, node, proxy=made is not None and made is not proxy)
        return proxy if made is None else cast("Proxy", made)

    def wrap_provider(node: Node, provider: Provider) -> Provider:
        made = config.hook.pytest_san_make_provider(config=config, node=node, provider=provider)
        note_replacement(config, node, provider=made is not None and made is not provider)
        return provider if made is None else cast("Provider", made)

    return wrap_provider, wrap_proxy


def pytest_sessionstart(session: pytest.Session) -> None:
    # Fail before collection, not in the first SAN test's setup.
    name = backend_name(session.config)
    if name not in known_backends(session.config):
        raise _unknown_backend(session.config, name)


# --- markers on items ---------------------------------------------------------------------

def marker_args(item: pytest.Item, marker: str) -> list[object]:
    return [arg for mark in item.iter_markers(marker) for arg in mark.args]


def uses_san_fixtures(fixturenames: Iterable[str]) -> bool:
    return not SAN_FIXTURES.isdisjoint(fixturenames)


def is_san_test(item: pytest.Item) -> bool:
    return (uses_san_fixtures(getattr(item, "fixturenames", ()))
            or item.get_closest_marker("san_rule") is not None
            or item.get_closest_marker("san_requires") is not None)


def rule_problems(item: pytest.Item) -> list[str]:
    problems = []
    for mark in item.iter_markers("san_rule"):
        if not mark.args:
            problems.append(f"{item.nodeid}: san_rule needs at least one rule id")
        for arg in mark.args:
            if not is_rule_id(arg):
                problems.append(f"{item.nodeid}: unknown SAN rule id {arg!r} in san_rule "
                                "(known: R1..R14, P1..P5)")
    return problems


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, pytest.CollectReport,
                                                                             pytest.CollectReport]:
    # A bad rule id turns the collector's report into a collection error naming test and id.
    rep = yield
    if rep.passed:
        problems = [p for node in rep.result if isinstance(node, pytest.Item) for p in rule_problems(node)]
        if problems:
            rep.outcome = "failed"
            rep.longrepr = "\n".join(problems)
            rep.result = []
    return rep


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    required = [str(cap) for cap in dict.fromkeys(marker_args(item, "san_requires"))]
    if not required:
        return
    backend = get_backend(item.config)
    reason = missing_reason(item.config, item, backend, required)
    if reason is not None:
        try:
            # Report the skip at the test, as skip markers are, not at this line.
            skip = pytest.skip.Exception(reason, _use_item_location=True)
        except TypeError:  # the keyword is pytest-internal; older/newer pytest: plain location
            skip = pytest.skip.Exception(reason)
        raise skip


# --- outcomes -------------------------------------------------------------------------------

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                         pytest.TestReport]:
    report = yield
    if is_san_test(item):
        rules = catalog_order(str(arg) for arg in marker_args(item, "san_rule"))
        vars(report)[_RULES_ATTR] = list(rules)
        if call.when == "teardown":
            leaks: list[str] = item.stash.get(LEAKS_KEY, [])
            vars(report)[_LEAKS_ATTR] = list(leaks)
    return report


@dataclasses.dataclass
class _Tally:
    """One SAN test's phases seen so far."""

    outcome: Outcome = "passed"
    reason: str = ""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _phase(report: pytest.TestReport) -> tuple[Outcome, str]:
    """Outcome and reason of one phase; a declared deviation is deviating; xfail and xpass count as skipped."""
    deviation = getattr(report, DEVIATION_ATTR, None)
    if deviation is not None:
        return "deviating", f"declared deviation: {deviation}"
    wasxfail = getattr(report, "wasxfail", None)
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = _first_line(crash.message if crash is not None else str(report.longrepr or ""))
        return "failed", message if report.when == "call" else f"error in {report.when}: {message}"
    if wasxfail is not None:
        kind = "xfail" if report.skipped else "xpass"
        return "skipped", f"{kind}: {wasxfail}" if wasxfail else kind
    if report.skipped:
        longrepr = report.longrepr
        text = str(longrepr[2]) if isinstance(longrepr, tuple | list) else str(longrepr or "")
        return "skipped", _first_line(text.removeprefix("Skipped: "))
    return "passed", ""


class ReportRecorder:
    """Turns the phase reports of SAN tests into the session's ConformanceReport.

    A plugin object (registered by pytest_configure) because pytest_runtest_logreport gets no
    config; its state still lives in ``config.stash``.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        rules = getattr(report, _RULES_ATTR, None)
        # Under pytest-xdist the controller hears every worker's reports: it takes the workers'
        # merged ConformanceReports instead (pytest_testnodedown).
        if rules is None or self.config.pluginmanager.hasplugin("dsession"):
            return
        pending = self.config.stash[PENDING_KEY]
        tally = pending.setdefault(report.nodeid, _Tally())
        outcome, reason = _phase(report)
        if worse(tally.outcome, outcome) != tally.outcome:
            tally.outcome, tally.reason = outcome, reason
        if report.when != "teardown":
            return
        del pending[report.nodeid]
        leaks: list[str] = getattr(report, _LEAKS_ATTR, None) or []
        if leaks and tally.reason.startswith("error in teardown"):
            tally.reason = f"{'/'.join(leak_rules(leaks))} leak: " + "; ".join(leaks)
        self.config.stash[REPORT_KEY].record(report.nodeid, rules, tally.outcome, tally.reason,
                                             leaked=bool(leaks), leak_ids=leak_rules(leaks))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """pytest-xdist: merge a finished worker's report into the controller's."""
        data = (getattr(node, "workeroutput", None) or {}).get("san_report")
        if data:
            self.config.stash[REPORT_KEY].merge(ConformanceReport.from_dict(data))


def record_model(config: pytest.Config, result: ModelResult) -> None:
    """pytest_san.model's test hands its run's result to the report (the ``"model"`` section)."""
    config.stash[REPORT_KEY].record_model(result)


# --- session end ----------------------------------------------------------------------------

def report_path(config: pytest.Config) -> Path | None:
    path = config.getoption("san_report")
    return Path(config.invocation_params.dir, path) if path else None


@pytest.hookimpl(trylast=True)  # after the runner tore down session fixtures that may use the backend
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    try:
        report = config.stash[REPORT_KEY]
        workeroutput = getattr(config, "workeroutput", None)
        path = report_path(config)
        if workeroutput is not None:
            workeroutput["san_report"] = report.to_dict()
        elif path is not None:
            data = report.to_dict()
            config.hook.pytest_san_conformance(config=config, report=data)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    finally:
        backend = created_backend(config)
        if backend is not None:
            del config.stash[BACKEND_KEY]
            backend.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    report = config.stash.get(REPORT_KEY, None)
    if report is None or not report.tests or hasattr(config, "workerinput"):
        return
    terminalreporter.write_sep("=", "SAN conformance")
    terminalreporter.write_line(report.header_line())
    for line, failed in report.table_lines():
        terminalreporter.write_line(line, red=failed)
    if report.model is not None:
        for line, failed in report.model.lines():
            terminalreporter.write_line(line, red=failed)
    path = report_path(config)
    if path is not None:
        terminalreporter.write_line(f"report written to {path}")
