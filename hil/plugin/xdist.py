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
from hil.controller.leases import (
    DEFAULT_LEASE_TIMEOUT,
    LeasePolicy,
    LeaseRequest,
    hosts_per_worker,
    now_iso,
)
from hil.inventory import HostConfig
from pytest_san.plugin.hooks import created_backend, wrappers

LEASES_KEY = pytest.StashKey[list[dict[str, Any]]]()
"""In the xdist controller: every finished worker's lease records."""
RUN_KEY = pytest.StashKey[str]()
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


def worker_count(config: pytest.Config) -> int:
    """The run's xdist workers: in a worker its ``workercount``; in the controller ``-n`` (1 without xdist)."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is not None:
        return int(workerinput.get("workercount", 1))
    numprocesses = config.getoption("numprocesses", None)
    if isinstance(numprocesses, int) and numprocesses > 0 and config.getoption("dist", "no") != "no":
        return numprocesses
    return 1


def lease_policy(config: pytest.Config, hosts: Sequence[HostConfig]) -> LeasePolicy:
    """This process's lease: as which worker of which run, how many of ``hosts``, from which offset."""
    setting = config.getoption("san_hosts_per_worker") or config.getini("san_hosts_per_worker")
    try:
        count = hosts_per_worker(hosts, setting)
    except ValueError as exc:
        raise pytest.UsageError(f"--san-hosts-per-worker: {exc}") from None
    names = ", ".join(h.name for h in hosts)
    if count > len(hosts):
        given = str(setting or "auto").strip().lower()
        if given == "auto":
            raise pytest.UsageError(
                f"--san-hosts-per-worker auto is {count} (a pair of verbs hosts), but the selection has "
                f"{len(hosts)} host(s): {names}: add a host, or make each host san_loopback or emulator-engine")
        raise pytest.UsageError(f"--san-hosts-per-worker={count}, but the selection has {len(hosts)} host(s): {names}")
    worker = worker_id(config)
    workers = worker_count(config)
    if workers * count > len(hosts):
        raise pytest.UsageError(
            f"{workers} xdist workers x {count} host(s) each need {workers * count} hosts, the selection has "
            f"{len(hosts)} ({names}): use -n {max(1, len(hosts) // count)} or fewer, or more hosts")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    request = LeaseRequest(worker=worker, run=run_id(config))
    return LeasePolicy(request=request, count=count, timeout=lease_timeout(config), notify=notifier(config),
                       first=index * count)


def leased_backend(config: pytest.Config, hosts: Sequence[HostConfig]) -> HilBackend:
    """The session's HilBackend on the hosts this process leased out of ``hosts``.

    A failure (a lease timeout, an agent that cannot start, a host that cannot be reached) is pytest-san's
    to report: once, and the session stops (``pytest_san.plugin.backends.make_backend``)."""
    backend = HilBackend(hosts, leases=lease_policy(config, hosts), wrap=wrappers(config))
    workeroutput: dict[str, Any] | None = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        # The very list: the backend fills in the ends when it closes, before xdist ships workeroutput.
        workeroutput[WORKEROUTPUT_LEASES] = backend.lease_log.records
    return backend


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
