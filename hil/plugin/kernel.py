"""The report's ``"kernel"``, ``"kernel_resources"`` and ``"proxy"`` (docs/downstream.md), under pytest and
pytest-xdist.

The backend's :class:`~hil.controller.kernel.KernelLog` gathers what each host's agent said (its kernel
release, the kernel witness's readings from every end-of-test batch). Here each test's readings are filed
under its node id once its teardown is done; at the session's end every host is read once more after its
agent closed its processes (before pytest-san writes the report); and the record lands in the report
through ``pytest_san_conformance``. An xdist worker ships its record in ``workeroutput`` and the
controller merges them.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from hil.controller.backend import HilBackend
from hil.controller.kernel import merge_records
from pytest_san.plugin.hooks import created_backend

WORKEROUTPUT_KERNEL = "san_kernel"
MERGED_KEY = pytest.StashKey[dict[str, Any]]()
PROXIES_KEY = pytest.StashKey[dict[str, Any]]()
"""Which proxy driver ran on each host, kept at the session's end for the terminal summary."""
"""In the xdist controller: {"kernel": {...}, "kernel_resources": {...}, "proxy": {...}} of every finished worker."""


def _backend(config: pytest.Config) -> HilBackend | None:
    backend = created_backend(config)
    return backend if isinstance(backend, HilBackend) else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    backend = _backend(item.config)
    if call.when == "teardown" and backend is not None:  # the end-of-test batch is done: file its readings
        backend.kernel_log.take(item.nodeid)
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Before pytest-san's own (trylast), which writes the report and closes the backend.
    backend = _backend(session.config)
    if backend is None:
        return
    backend.end_kernel_record()
    session.config.stash[PROXIES_KEY] = dict(backend.kernel_log.proxies)  # the backend is gone by the summary
    workeroutput: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[WORKEROUTPUT_KERNEL] = {"kernel": dict(backend.kernel_log.kernels),
                                             "kernel_resources": backend.kernel_log.record,
                                             "proxy": dict(backend.kernel_log.proxies)}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, in the controller: keep a finished worker's record."""
    data = (getattr(node, "workeroutput", None) or {}).get(WORKEROUTPUT_KERNEL)
    config: pytest.Config | None = getattr(node, "config", None)
    if data and config is not None:
        merged = config.stash.setdefault(MERGED_KEY, {"kernel": {}, "kernel_resources": {}, "proxy": {}})
        merged["kernel"].update(data.get("kernel", {}))
        merged["proxy"].update(data.get("proxy", {}))
        merge_records(merged["kernel_resources"], data.get("kernel_resources", {}))


def pytest_san_conformance(config: pytest.Config, report: dict[str, Any]) -> None:
    """Add ``"kernel"`` (host -> kernel release), ``"kernel_resources"`` (host -> the kernel's record) and
    ``"proxy"`` (host -> which proxy driver ran there: ``{"kind": "kernel module", "module": "san_proxy", ...}`` or
    ``{"kind": "userspace stand-in", "why": ...}``)."""
    merged = config.stash.get(MERGED_KEY, None)
    backend = _backend(config)
    if merged is None and backend is None:
        return
    kernels: dict[str, str] = dict(merged["kernel"]) if merged else {}
    proxies: dict[str, Any] = dict(merged["proxy"]) if merged else {}
    resources: dict[str, Any] = {}
    if merged:
        merge_records(resources, merged["kernel_resources"])
    if backend is not None:
        kernels.update(backend.kernel_log.kernels)
        proxies.update(backend.kernel_log.proxies)
        merge_records(resources, backend.kernel_log.record)
    report["kernel"] = dict(sorted(kernels.items()))
    report["kernel_resources"] = dict(sorted(resources.items()))
    if proxies:
        report["proxy"] = dict(sorted(proxies.items()))


def proxy_line(proxies: dict[str, Any]) -> str:
    """One line naming each host's proxy driver: the kernel module, or the stand-in and why."""
    parts = []
    for host, proxy in sorted(proxies.items()):
        if proxy.get("kind") == "kernel module":
            parts.append(f"{host}: kernel module {proxy.get('module')} (abi {proxy.get('abi')})")
        else:
            why = f" ({proxy['why']})" if proxy.get("why") else ""
            parts.append(f"{host}: {proxy.get('kind', 'unknown')}{why}")
    return "proxy driver: " + "; ".join(parts)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    merged = config.stash.get(MERGED_KEY, None)
    proxies: dict[str, Any] = dict(merged["proxy"]) if merged else {}
    kept: dict[str, Any] = config.stash.get(PROXIES_KEY, {})
    proxies.update(kept)
    if proxies:
        terminalreporter.write_line(proxy_line(proxies))
