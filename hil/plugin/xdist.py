"""Leases under pytest (with or without pytest-xdist): who leases, the report's ``leases``.

Each pytest process that runs tests -- the main one, or every xdist worker -- builds its own
session backend, which leases its own hosts out of the selected ones (``--san-hosts-per-worker``).
Workers keep their hosts for the whole session, so any ``--dist`` mode works: every worker runs any
test on its own hosts. The workers' lease records travel to the controller in ``workeroutput`` and
land in the merged ``--san-report`` as ``"leases"``.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from hil.controller.backend import HilBackend
from hil.controller.errors import AgentStartError
from hil.controller.leases import (
    DEFAULT_LEASE_TIMEOUT,
    LeasePolicy,
    LeaseRequest,
    LeaseTimeout,
    hosts_per_worker,
    now_iso,
)
from hil.inventory import HostConfig
from pytest_san.plugin.hooks import created_backend, wrappers

LEASES_KEY = pytest.StashKey[list[dict[str, Any]]]()
"""In the xdist controller: every finished worker's lease records."""
RUN_KEY = pytest.StashKey[str]()
FAILED_KEY = pytest.StashKey[str]()
"""Why leasing failed: the next test fails at once instead of waiting out the timeout again."""
START_FAILED_KEY = pytest.StashKey[dict[str, AgentStartError]]()
"""Per host: why its agent could not start. The next test fails at once, not after starting it again."""
REMEMBERED = " [remembered: the agent's first start failed so; it is not started again this session]"
WORKEROUTPUT_LEASES = "san_leases"


def worker_id(config: pytest.Config) -> str:
    """The xdist worker id (gw0, gw1, ...), or "main" without xdist."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    return str(workerinput["workerid"]) if workerinput else "main"


def run_id(config: pytest.Config) -> str:
    """One id for the whole run: xdist's testrunuid in every worker, else made up once."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput and workerinput.get("testrunuid"):
        return str(workerinput["testrunuid"])[:12]
    if RUN_KEY not in config.stash:
        config.stash[RUN_KEY] = uuid.uuid4().hex[:12]
    return config.stash[RUN_KEY]


def lease_timeout(config: pytest.Config) -> float:
    value = config.getoption("san_lease_timeout")
    if value is None:
        try:
            value = float(config.getini("san_lease_timeout") or DEFAULT_LEASE_TIMEOUT)
        except ValueError:
            raise pytest.UsageError(f"ini san_lease_timeout: expected seconds, got "
                                    f"{config.getini('san_lease_timeout')!r}") from None
    if value < 0:
        raise pytest.UsageError(f"--san-lease-timeout: expected seconds >= 0, got {value:g}")
    return float(value)


def notifier(config: pytest.Config) -> Callable[[str], None]:
    """A line the person at the terminal sees at once, even from inside a test's setup or a worker."""
    worker = worker_id(config)

    def notify(message: str) -> None:
        capman = config.pluginmanager.getplugin("capturemanager")
        suspended = capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()
        with suspended:
            reporter = config.pluginmanager.getplugin("terminalreporter")
            if worker == "main" and reporter is not None:
                reporter.write_line(message, yellow=True)
            else:  # an xdist worker's stderr is the controller's
                print(f"[{worker}] {message}" if worker != "main" else message, file=sys.stderr, flush=True)

    return notify


def lease_policy(config: pytest.Config, hosts: Sequence[HostConfig]) -> LeasePolicy:
    """This process's lease: as which worker of which run, how many of ``hosts``, from which offset."""
    setting = config.getoption("san_hosts_per_worker") or config.getini("san_hosts_per_worker")
    try:
        count = hosts_per_worker(hosts, setting)
    except ValueError as exc:
        raise pytest.UsageError(f"--san-hosts-per-worker: {exc}") from None
    names = ", ".join(h.name for h in hosts)
    if count > len(hosts):
        raise pytest.UsageError(f"--san-hosts-per-worker={count}, but the selection has {len(hosts)} host(s): {names}")
    worker = worker_id(config)
    workerinput: dict[str, Any] = getattr(config, "workerinput", None) or {}
    workers = int(workerinput.get("workercount", 1))
    if workers * count > len(hosts):
        raise pytest.UsageError(
            f"{workers} xdist workers x {count} host(s) each need {workers * count} hosts, the selection has "
            f"{len(hosts)} ({names}): use -n {max(1, len(hosts) // count)} or fewer, or more hosts")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    request = LeaseRequest(worker=worker, run=run_id(config))
    return LeasePolicy(request=request, count=count, timeout=lease_timeout(config), notify=notifier(config),
                       first=index * count)


def leased_backend(config: pytest.Config, hosts: Sequence[HostConfig]) -> HilBackend:
    """The session's HilBackend on the hosts this process leased out of ``hosts``."""
    failed = config.stash.get(FAILED_KEY, None)
    if failed is not None:
        raise LeaseTimeout(failed)
    start_failed = config.stash.setdefault(START_FAILED_KEY, {})
    for host in hosts:
        if host.name in start_failed:
            raise remembered(start_failed[host.name])
    policy = lease_policy(config, hosts)
    try:
        backend = HilBackend(hosts, leases=policy, wrap=wrappers(config))
    except LeaseTimeout as exc:
        config.stash[FAILED_KEY] = str(exc)
        raise
    except AgentStartError as exc:
        start_failed[exc.host] = exc
        raise
    workeroutput: dict[str, Any] | None = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        # The very list: the backend fills in the ends when it closes, before xdist ships workeroutput.
        workeroutput[WORKEROUTPUT_LEASES] = backend.lease_log.records
    return backend


def remembered(first: AgentStartError) -> AgentStartError:
    """``first`` again, its reason still on the first line, saying that it is the remembered first failure."""
    reason, newline, rest = str(first).partition("\n")
    return AgentStartError(reason + REMEMBERED + newline + rest, first.host)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, in the controller: keep a finished worker's lease records."""
    records = (getattr(node, "workeroutput", None) or {}).get(WORKEROUTPUT_LEASES)
    config: pytest.Config | None = getattr(node, "config", None)
    if records and config is not None:
        config.stash.setdefault(LEASES_KEY, []).extend(records)


def pytest_san_conformance(config: pytest.Config, report: dict[str, Any]) -> None:
    """Add ``"leases"``: every worker's (or this process's) records, by start time."""
    leases = [dict(r) for r in config.stash.get(LEASES_KEY, [])]
    if not leases and report.get("backend") != "hil":
        return  # not a hil run: nothing to add (and no need to import paramiko)
    backend = created_backend(config)
    if isinstance(backend, HilBackend):
        # Written just before the backend closes: a lease still held ends now.
        leases += [dict(r, end=r["end"] or now_iso()) for r in backend.lease_log.records]
    report["leases"] = sorted(leases, key=lambda r: (str(r["start"]), str(r["worker"])))
