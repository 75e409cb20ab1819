"""The hil backend from the selected hosts (``hosts.py``), and host diagnostics on every failed test."""

from __future__ import annotations

from collections.abc import Generator, Iterable

import pytest

from hil.controller.backend import BackendBroken, HilBackend
from hil.plugin.diagnostics import DIAGNOSTICS_PREFIX, collect
from hil.plugin.hosts import select_hosts
from hil.plugin.labgrid import check_labgrid, labgrid_filter, placed_backend
from hil.plugin.xdist import lease_policy, leased_backend
from pytest_san.plugin.hooks import created_backend


def pytest_san_backend_names(config: pytest.Config) -> Iterable[str]:
    return ["hil"]


def pytest_san_make_backend(config: pytest.Config, name: str) -> HilBackend | None:
    if name != "hil":
        return None
    if labgrid_filter(config):
        return placed_backend(config)
    return leased_backend(config, select_hosts(config))


def pytest_sessionstart(session: pytest.Session) -> None:
    # The host list and the lease options are read (and any problem in them reported, as one UsageError)
    # once, before collection; not per test. In an xdist controller too, before any worker starts.
    if labgrid_filter(session.config):
        check_labgrid(session.config)  # the place is the hosts: its reservation waits for the first SAN test
        return
    lease_policy(session.config, select_hosts(session.config))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    backend = created_backend(item.config)
    if report.failed and call.excinfo is not None and call.excinfo.errisinstance(BackendBroken):
        # A host is gone for good (its agent died and could not start again, or its kernel oopsed): said once,
        # with what it knows, and the session stops after this test.
        report.longrepr = f"san: {call.excinfo.value}"
        if not item.session.shouldfail:
            item.session.shouldfail = (f"san: {str(call.excinfo.value).partition(chr(10))[0]} "
                                       "(no SAN test can run: the error above)")
        return report  # its host's diagnostics would only say that its transport is closed
    if report.failed and isinstance(backend, HilBackend):
        for agent in backend.agents:
            report.sections.append((f"{DIAGNOSTICS_PREFIX}{agent.host.name}",
                                    collect(agent.host.name, agent.transport)))
    return report
