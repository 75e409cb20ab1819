"""Stale places: those a pytest-san identity acquired and whose hosts hold no agent lease any more.

labgrid keeps a place acquired, and its reservation ``acquired``, after its holder died (SIGKILL, a lost
controller): nothing on the coordinator notices. The hosts do: an agent's lease is an abstract socket that
the kernel frees with the agent (``hil/agent/lease.py``). So a place of a pytest-san identity
(``CONTROLLER/pytest-san.USER.RUN.WORKER``) whose every host shows no listening lease socket is stale: its
reservation is cancelled, then the place released from that identity (labgrid's ``release-from``, which does
nothing if someone else acquired it meanwhile).

Safe from cron: a place is left alone when any of its hosts holds a lease that could be its agent's (for a
verbs host with no ``san_device``/``san_port``, any verbs lease on that machine; for an emulator host, its
name in any scope), when a host cannot be checked (unreachable: nothing is proven), when it was acquired
less than ``min_age`` seconds ago (its agents may still be starting), and when it is no pytest-san identity's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hil.agent.lease import PREFIX, lease_name
from hil.inventory import HostConfig
from hil.scheduling.config import identity_of
from hil.scheduling.coordinator import CoordinatorSession, PlaceView
from hil.scheduling.places import PlaceError, place_hosts
from hil.transport import TransportError, open_transport

__all__ = ["DEFAULT_MIN_AGE", "Reaped", "host_leases", "lease_patterns", "live_leases", "reap"]

DEFAULT_MIN_AGE = 120.0  # seconds: a place acquired more recently may still be starting its agents
CHECK_TIMEOUT = 30.0


def lease_patterns(host: HostConfig) -> tuple[str, ...]:
    """What a lease of ``host``'s agent looks like in ``/proc/net/unix`` (``@`` + name): exact names, or
    prefixes ending in ``/`` (any of them counts)."""
    if host.engine == "verbs":
        if host.device and host.device_port is not None:
            return ("@" + lease_name("", host.name, "verbs", host.device, host.device_port),)
        return (f"@{PREFIX}verbs/",)
    suffix = "/" + lease_name("/", host.name).rpartition("/")[2]
    return (f"@{PREFIX}*{suffix}",)


def live_leases(proc_net_unix: str, patterns: tuple[str, ...]) -> list[str]:
    """The listening abstract sockets of ``proc_net_unix`` (the file's text) that match ``patterns``."""
    found = []
    for line in proc_net_unix.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or fields[5] != "01" or not fields[7].startswith("@" + PREFIX):
            continue
        name = fields[7]
        for pattern in patterns:
            head, star, tail = pattern.partition("*")
            if (star and name.startswith(head) and name.endswith(tail)) or (
                    not star and (name == pattern or (pattern.endswith("/") and name.startswith(pattern)))):
                found.append(name[1:])
                break
    return found


def host_leases(host: HostConfig) -> list[str]:
    """The live leases on ``host`` that could be its agent's (read over its transport); TransportError if it
    cannot be read."""
    with open_transport(host) as transport:
        result = transport.run(["cat", "/proc/net/unix"], timeout=CHECK_TIMEOUT)
    if result.returncode != 0:
        raise TransportError(host.name, f"cat /proc/net/unix failed: {result.stderr.strip()[:200]}")
    return live_leases(result.stdout, lease_patterns(host))


@dataclass
class Reaped:
    """What a pass did: places released, kept (why), not checked (why)."""

    released: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)
    unchecked: list[tuple[str, str]] = field(default_factory=list)

    def lines(self, dry_run: bool = False) -> list[str]:
        verb = "would release" if dry_run else "released"
        return ([f"{verb} {name}" for name in self.released] + [f"kept {n}: {why}" for n, why in self.kept]
                + [f"not checked {n}: {why}" for n, why in self.unchecked])


def reap(session: CoordinatorSession, inventory: Mapping[str, HostConfig], *, min_age: float = DEFAULT_MIN_AGE,
         dry_run: bool = False, leases: Callable[[HostConfig], list[str]] = host_leases,
         now: Callable[[], float] = time.time) -> Reaped:
    """One pass over the coordinator's places (see the module's doc)."""
    done = Reaped()
    resources = session.resources()
    for name, place in sorted(session.places().items()):
        holder = place.acquired
        if holder is None or identity_of(holder) is None:
            continue
        age = now() - place.changed
        if age < min_age:
            done.kept.append((name, f"acquired by {holder} {age:.0f} s ago, less than --min-age {min_age:g} s"))
            continue
        try:
            hosts = place_hosts(place, resources, inventory)
        except PlaceError as exc:
            done.unchecked.append((name, str(exc)))
            continue
        live: list[str] = []
        trouble = ""
        for host in hosts:
            try:
                live += [f"host {host.name} holds lease {lease}" for lease in leases(host)]
            except (TransportError, OSError) as exc:
                trouble = f"host {host.name} cannot be checked: {str(exc).splitlines()[0]}"
                break
        if trouble:
            done.unchecked.append((name, trouble))
            continue
        if live:
            done.kept.append((name, f"acquired by {holder}, live: {'; '.join(live)}"))
            continue
        if not dry_run:
            _release(session, place)
        done.released.append(name)
    return done


def _release(session: CoordinatorSession, seen: PlaceView) -> None:
    """Cancel the reservation of the identity that acquired ``seen``, then release the place from it: only if
    it is still that identity's (and unchanged since it was checked)."""
    now = session.places().get(seen.name)
    if now is None or now.acquired != seen.acquired or now.changed != seen.changed:
        return
    assert seen.acquired is not None
    if now.reservation:
        owners = {r.token: r.owner for r in session.reservations()}
        if owners.get(now.reservation) == seen.acquired:
            session.cancel(now.reservation)
    session.release_from(seen.name, seen.acquired)
