"""Leases on lab hosts, the controller's side: who we are, waiting for free hosts, the lease records.

The lease itself is held by the agent on the host (``hil/agent/lease.py``: an abstract socket kept for
the agent's life, the same for every user of the host), so it ends with the agent, its SSH connection or
its controller; nothing here can leave a stale lock behind. This module starts agents until it has the
hosts it needs, waits (with a visible message) while they are leased by others, and gives up after a
timeout naming the holders.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import random
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Generic, TypedDict, TypeVar

from hil.controller.errors import AgentError, HostBusy
from hil.inventory import HostConfig

__all__ = [
    "DEFAULT_LEASE_TIMEOUT",
    "HostBusy",
    "LeaseLog",
    "LeasePolicy",
    "LeaseRecord",
    "LeaseRefused",
    "LeaseRequest",
    "LeaseTimeout",
    "Leaser",
    "describe_holder",
    "hosts_per_worker",
    "now_iso",
    "self_sufficient",
    "waiting_message",
]

log = logging.getLogger(__name__)  # leases acquired, waited for, released

DEFAULT_LEASE_TIMEOUT = 300.0
POLL_INTERVAL = 1.0  # seconds between rounds while every wanted host is leased (plus up to half of it, random)


def now_iso(at: float | None = None) -> str:
    """Local time with its UTC offset, to the millisecond (``time.time()`` now, or ``at``)."""
    moment = datetime.now(timezone.utc) if at is None else datetime.fromtimestamp(at, timezone.utc)
    return moment.astimezone().isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class LeaseRequest:
    """Who asks for the lease: what the holding agent answers whoever finds the host busy."""

    worker: str = "main"  # the xdist worker id (gw0, gw1, ...) or "main"
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # shared by every worker of one run
    controller: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)

    def holder(self) -> dict[str, str | int]:
        return {"worker": self.worker, "run": self.run, "controller": self.controller, "pid": self.pid}


def describe_holder(holder: Mapping[str, object]) -> str:
    """Who holds a lease, from its record (hil/agent/lease.py ``read_holder``), the kernel's facts first.

    An agent: 'worker gw1 of run 3f2a... on ctl (pid 4242) since 2026-..., its agent pid 77 of user ci (uid
    1001)' (the worker, run, controller and since are what the agent says; the pid, user and uid the kernel's).
    Any other process: 'a process that is no pytest-san agent: pid 77 of user bob (uid 1001), command
    "..."' (nothing it says is shown).
    """
    if holder.get("refused"):
        return f"no one: the agent could not take its lease ({holder['refused']})"
    unanswered = f" ({holder['unanswered']})" if holder.get("unanswered") else ""
    lease = f" on lease {holder['lease']}" if holder.get("lease") else ""
    if "uid" in holder and not holder.get("agent"):
        return (f"a process that is no pytest-san agent{lease}: pid {holder.get('agent_pid') or '?'} of user "
                f"{holder.get('user')} (uid {holder['uid']}), command {str(holder.get('command') or '?')!r}"
                f"{unanswered}")
    if "uid" not in holder and not any(holder.get(k) for k in ("worker", "run", "controller")):
        return f"an unknown holder{lease}{unanswered or ' (it did not say who it is)'}"
    worker = holder.get("worker") or "?"
    text = f"worker {worker} of run {holder.get('run') or '?'} on {holder.get('controller') or '?'}"
    if holder.get("pid"):
        text += f" (pid {holder['pid']})"
    if holder.get("since"):
        text += f" since {holder['since']}"
    if "uid" in holder:
        text += f", its agent pid {holder.get('agent_pid') or '?'} of user {holder.get('user')} (uid {holder['uid']})"
        if holder.get("host"):
            text += f" for host {holder['host']}"
    return text + unanswered


def waiting_message(host: str, holder: Mapping[str, object]) -> str:
    return f"san: waiting for host {host}, leased by {describe_holder(holder)}"


class LeaseTimeout(AgentError):
    """No free hosts within the lease timeout; the message names every holder, ``holders`` has their records
    (host name -> :func:`describe_holder`'s record)."""

    def __init__(self, message: str, holders: Mapping[str, Mapping[str, object]] | None = None) -> None:
        super().__init__(message)
        self.holders: dict[str, dict[str, object]] = {h: dict(r) for h, r in (holders or {}).items()}

    def __reduce__(self) -> tuple[type[LeaseTimeout], tuple[str, dict[str, dict[str, object]]]]:
        return type(self), (str(self), self.holders)  # pickles across xdist workers


class LeaseRefused(AgentError):
    """The agent could not take its host's lease at all (it says why); waiting would not help."""


def _check_refused(host: HostConfig, busy: HostBusy) -> None:
    refused = busy.holder.get("refused")
    if refused:
        raise LeaseRefused(f"san: cannot lease host {host.name} ({host.host}:{host.port}): {refused}") from None


def self_sufficient(host: HostConfig) -> bool:
    """A host that serves both ends of a connection alone: the emulator engine, or ``san_loopback``."""
    return host.engine == "emulator" or host.loopback


def hosts_per_worker(hosts: Sequence[HostConfig], setting: str | int | None) -> int:
    """How many hosts one worker (or a run without xdist) leases out of ``hosts``.

    ``auto`` (default): 1 when every host is self-sufficient (emulator engine or ``san_loopback``), else
    2 (a pair of verbs hosts); ``all``: every host; or a number.
    """
    text = "auto" if setting in (None, "") else str(setting).strip().lower()
    if text == "all":
        return len(hosts)
    if text == "auto":
        return 1 if all(self_sufficient(h) for h in hosts) else 2
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"hosts per worker: expected a number, 'auto' or 'all', got {setting!r}") from None
    if count < 1:
        raise ValueError(f"hosts per worker: expected at least 1, got {count}")
    return count


@dataclass
class LeasePolicy:
    """How a backend leases: as whom, how many of the candidate hosts, how long to wait, where to say so."""

    request: LeaseRequest = field(default_factory=LeaseRequest)
    count: int | None = None  # None: every candidate host
    timeout: float = DEFAULT_LEASE_TIMEOUT
    notify: Callable[[str], None] | None = None  # None: a line on stderr
    first: int = 0  # candidate to try first (workers start at their own offset and rarely collide)
    poll: float = POLL_INTERVAL


class LeaseRecord(TypedDict):
    worker: str
    hosts: list[str]
    start: str  # ISO times (now_iso)
    end: str | None  # None while held


class LeaseLog:
    """The leases a backend held: ``{"worker", "hosts", "start", "end"}`` dicts (ISO times; end None while held).

    Plain dicts in a plain list, so an xdist worker can ship the very list in ``workeroutput``.
    """

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.records: list[LeaseRecord] = []

    def start(self, hosts: Sequence[str], at: float | None = None) -> None:
        self.records.append({"worker": self.worker, "hosts": list(hosts), "start": now_iso(at), "end": None})
        log.info("lease acquired by worker %s: hosts %s", self.worker, ", ".join(hosts))

    def end(self, at: float | None = None) -> None:
        if self.records and self.records[-1]["end"] is None:
            self.records[-1]["end"] = now_iso(at)
            log.info("lease released by worker %s: hosts %s", self.worker, ", ".join(self.records[-1]["hosts"]))

    @property
    def held(self) -> bool:
        return bool(self.records) and self.records[-1]["end"] is None


A = TypeVar("A")


class Leaser(Generic[A]):
    """Starts agents (``start(host)``, which raises :class:`HostBusy` for a leased host) until it has enough."""

    def __init__(self, policy: LeasePolicy, start: Callable[[HostConfig], A], close: Callable[[A], None],
                 *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.policy = policy
        self._start = start
        self._close = close
        self._clock = clock
        self._sleep = sleep
        self._announced: dict[str, str] = {}

    def notify(self, message: str) -> None:
        log.info("%s", message)
        if self.policy.notify is not None:
            self.policy.notify(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def _announce(self, busy: Mapping[str, Mapping[str, object]]) -> None:
        """One line per busy host, again only when its holder changed."""
        for host, holder in busy.items():
            text = describe_holder(holder)
            if self._announced.get(host) != text:
                self._announced[host] = text
                self.notify(waiting_message(host, holder) + f" (up to {self.policy.timeout:g} s, --san-lease-timeout)")

    def _timeout(self, wanted: int, candidates: Sequence[HostConfig],
                 busy: Mapping[str, Mapping[str, object]]) -> LeaseTimeout:
        names = ", ".join(h.name for h in candidates)
        holders = "; ".join(f"host {host} is leased by {describe_holder(holder)}" for host, holder in busy.items())
        return LeaseTimeout(f"san: could not lease {wanted} of the hosts {names} within {self.policy.timeout:g} s "
                            f"(--san-lease-timeout): {holders}", busy)

    def _wait(self, deadline: float) -> None:
        pause = self.policy.poll * (1 + random.random() / 2)
        self._sleep(max(0.0, min(pause, deadline - self._clock())))

    def acquire(self, candidates: Sequence[HostConfig]) -> list[A]:
        """``count`` agents on the first free candidates (from ``first`` on), all or nothing per round.

        A round that finds too few free hosts gives back what it got before waiting, so two workers
        that each hold part of what they need can never wait for each other.
        """
        count = len(candidates) if self.policy.count is None else self.policy.count
        if not candidates or count > len(candidates):
            raise ValueError(f"need {count} host(s), the selection has {len(candidates)}")
        first = self.policy.first % len(candidates)
        order = [*candidates[first:], *candidates[:first]]
        deadline = self._clock() + self.policy.timeout
        while True:
            got: list[A] = []
            busy: dict[str, dict[str, object]] = {}
            if count == len(order):  # every host: their agents start at once (each start is seconds of SSH)
                got, busy = self._start_all(order)
            else:
                try:
                    for host in order:
                        if len(got) == count:
                            break
                        try:
                            got.append(self._start(host))
                        except HostBusy as exc:
                            _check_refused(host, exc)
                            busy[host.name] = exc.holder
                except BaseException:
                    for agent in got:
                        self._close(agent)
                    raise
            if len(got) == count:
                return got
            for agent in got:
                self._close(agent)
            if self._clock() >= deadline:
                if self.policy.timeout > 0:  # one round (agents started over SSH) can outlast a short timeout
                    self._announce(busy)
                raise self._timeout(count, candidates, busy)
            self._announce(busy)
            self._wait(deadline)

    def _start_all(self, hosts: Sequence[HostConfig]) -> tuple[list[A], dict[str, dict[str, object]]]:
        """Start an agent on each of ``hosts`` in parallel: (the agents, in order; the busy hosts' holders).
        Any other failure closes the agents that started and is raised (the first host's, in order)."""
        with concurrent.futures.ThreadPoolExecutor(len(hosts), thread_name_prefix="san-start") as pool:
            futures = [pool.submit(self._start, host) for host in hosts]
            concurrent.futures.wait(futures)
        got: list[A] = [f.result() for f in futures if f.exception() is None]
        busy: dict[str, dict[str, object]] = {}
        failure: BaseException | None = None
        for host, future in zip(hosts, futures, strict=True):
            exc = future.exception()
            if isinstance(exc, HostBusy) and failure is None:
                try:
                    _check_refused(host, exc)
                except BaseException as refused:
                    failure = refused
                busy[host.name] = exc.holder
            elif exc is not None and failure is None:
                failure = exc
        if failure is not None:
            for agent in got:
                self._close(agent)
            raise failure
        return got, busy

    def restart(self, host: HostConfig, start: Callable[[], None]) -> None:
        """Start ``host``'s agent again (``start()`` raises HostBusy while another holds it), waiting as above."""
        deadline = self._clock() + self.policy.timeout
        while True:
            try:
                start()
                return
            except HostBusy as exc:
                _check_refused(host, exc)
                if self._clock() >= deadline:
                    raise self._timeout(1, [host], {host.name: exc.holder}) from None
                self._announce({host.name: exc.holder})
                self._wait(deadline)
