"""pytest plugin for ``--san-backend=hil``: inventory options and the backend hook."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

pytest_plugins = ["hil.xdist"]  # leases: --san-lease-timeout, --san-hosts-per-worker, the report's "leases"

DIAGNOSTICS_PREFIX = "san host diagnostics: "
"""A failed test's report section per host: this prefix, then its name (hil/nightly_plugin.py reads them)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("san")
    group.addoption("--san-inventory", metavar="PATH", default=None,
                    help="lab inventory (Ansible-style YAML) for --san-backend=hil")
    group.addoption("--san-group", metavar="GROUP", default=None,
                    help="inventory group whose hosts are used (default: san)")
    group.addoption("--san-hosts", metavar="NAMES", default=None,
                    help="comma-separated subset of the group's hosts")
    parser.addini("san_inventory", "lab inventory for --san-backend=hil", default=None)
    parser.addini("san_group", "inventory group used by --san-backend=hil", default="san")


def pytest_san_backend_names(config: pytest.Config) -> Iterable[str]:
    return ["hil"]


def pytest_san_make_backend(config: pytest.Config, name: str) -> Any:
    if name != "hil":
        return None
    from .inventory import InventoryError, load_inventory

    path = config.getoption("san_inventory") or config.getini("san_inventory")
    if not path:
        raise pytest.UsageError("--san-backend=hil needs --san-inventory PATH (or the san_inventory ini key)")
    group = config.getoption("san_group") or config.getini("san_group") or "san"
    names = config.getoption("san_hosts")
    try:
        hosts = load_inventory(path).select(group, names.split(",") if names else None)
    except InventoryError as exc:
        raise pytest.UsageError(str(exc)) from None
    from .xdist import leased_backend

    return leased_backend(config, hosts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed:
        return
    from pytest_san.plugin.hooks import created_backend

    from .backend import HilBackend
    from .diagnostics import collect

    backend = created_backend(item.config)
    if not isinstance(backend, HilBackend):
        return
    for agent in backend.agents:
        report.sections.append((f"{DIAGNOSTICS_PREFIX}{agent.host.name}",
                                collect(agent.host.name, agent.transport)))
