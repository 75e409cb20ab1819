"""The hil backend from the inventory, and host diagnostics on every failed test."""

from __future__ import annotations

from collections.abc import Generator, Iterable

import pytest

from hil.controller.backend import HilBackend
from hil.inventory import InventoryError, load_inventory
from hil.plugin.diagnostics import DIAGNOSTICS_PREFIX, collect
from hil.plugin.xdist import leased_backend
from pytest_san.plugin.hooks import created_backend


def pytest_san_backend_names(config: pytest.Config) -> Iterable[str]:
    return ["hil"]


def pytest_san_make_backend(config: pytest.Config, name: str) -> HilBackend | None:
    if name != "hil":
        return None
    path = config.getoption("san_inventory") or config.getini("san_inventory")
    if not path:
        raise pytest.UsageError("--san-backend=hil needs --san-inventory PATH (or the san_inventory ini key)")
    group = config.getoption("san_group") or config.getini("san_group") or "san"
    names = config.getoption("san_hosts")
    try:
        hosts = load_inventory(path).select(group, names.split(",") if names else None)
    except InventoryError as exc:
        raise pytest.UsageError(str(exc)) from None
    return leased_backend(config, hosts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    backend = created_backend(item.config)
    if report.failed and isinstance(backend, HilBackend):
        for agent in backend.agents:
            report.sections.append((f"{DIAGNOSTICS_PREFIX}{agent.host.name}",
                                    collect(agent.host.name, agent.transport)))
    return report
