"""``--san-labgrid FILTER``: this process's hosts are a labgrid place, reserved, waited for and acquired.

Each pytest process that runs tests (the main one, or every xdist worker) books its own place
(``hil.scheduling.booking``) as ``CONTROLLER/pytest-san.USER.RUN.WORKER``, so that workers get distinct
places and labgrid's ``who`` shows which run and worker has which. The place's ``NetworkService`` resources
become the hosts (``hil.scheduling.places``, with the inventory's settings for them); the agents still take
their kernel lease on every host, at once and without waiting: a host leased already means labgrid gave it out
twice, and the run fails naming the lease's real holder. At the end (the backend's close at session finish,
else unconfigure, atexit or SIGTERM) the agents stop first, then the reservation is cancelled and the place
released, in that order.

labgrid installs a pytest plugin of its own (``--lg-env``, ``--lg-coordinator``...), which pytest-san does not use.
The two coexist in a run, but labgrid's costs every pytest process its import, turns on live logs at ``-vv``
and cannot be configured twice in one process (in-process ``pytester`` runs fail): ``-p no:labgrid`` turns it
off (docs/labgrid.md).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import pytest

from hil.controller.backend import HilBackend
from hil.controller.leases import LeasePolicy, LeaseRequest, LeaseTimeout, describe_holder
from hil.extras import missing_extra
from hil.inventory import HostConfig, InventoryError, load_inventory
from hil.plugin.hosts import apply_overrides, inventory_path
from hil.plugin.xdist import WORKEROUTPUT_LEASES, lease_timeout, notifier, run_id, worker_id
from hil.scheduling.config import COORDINATOR_VAR, LabgridConfig, LabgridConfigError, current_identity
from pytest_san.plugin.hooks import wrappers

__all__ = ["check_labgrid", "labgrid_filter", "placed_backend"]

CONFIG_KEY = pytest.StashKey[LabgridConfig]()


def labgrid_filter(config: pytest.Config) -> str | None:
    value = config.getoption("san_labgrid", None)
    return str(value) if value else None


def _inventory(config: pytest.Config) -> dict[str, HostConfig]:
    path = inventory_path(config)
    if path is None:
        return {}
    try:
        hosts = load_inventory(path).hosts
    except InventoryError as exc:
        raise pytest.UsageError(str(exc)) from None
    except ImportError as exc:  # PyYAML
        raise pytest.UsageError(f"--san-inventory: {missing_extra(exc) or exc}") from None
    return {name: apply_overrides(config, host) for name, host in hosts.items()}


def _inventory_coordinator(hosts: dict[str, HostConfig]) -> str | None:
    values = {str(h.extra[COORDINATOR_VAR]) for h in hosts.values() if h.extra.get(COORDINATOR_VAR)}
    if len(values) > 1:
        raise pytest.UsageError(f"the inventory's hosts name {len(values)} labgrid coordinators in {COORDINATOR_VAR} "
                                f"({', '.join(sorted(values))}): set one, for the group san or all")
    return values.pop() if values else None


def check_labgrid(config: pytest.Config) -> LabgridConfig:
    """The run's labgrid settings, read once; one :class:`pytest.UsageError` names any problem (labgrid
    missing included: which extra to install)."""
    if CONFIG_KEY in config.stash:
        return config.stash[CONFIG_KEY]
    text = labgrid_filter(config)
    assert text is not None
    if config.getoption("san_hosts", None):
        raise pytest.UsageError("--san-hosts and --san-labgrid exclude each other: the labgrid place is the hosts "
                                "(--san-inventory still gives their settings)")
    try:
        import labgrid.remote.client  # noqa: F401  (the extra; imported by hil.scheduling.coordinator on use)
    except ImportError as exc:
        why = missing_extra(exc) or f"{exc}: install the labgrid extra: pip install 'pytest-san[labgrid]'"
        raise pytest.UsageError(f"--san-labgrid: {why}") from None
    try:
        settings = LabgridConfig.from_settings(
            text, option=config.getoption("san_labgrid_coordinator", None), environ=os.environ,
            inventory=_inventory_coordinator(_inventory(config)),
            priority=config.getoption("san_labgrid_priority", None))
    except LabgridConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[CONFIG_KEY] = settings
    return settings


class PlacedBackend(HilBackend):
    """A HilBackend on a labgrid place: closing it stops the agents, then ends the booking."""

    def __init__(self, hosts: Sequence[HostConfig], *, booking: Any, leases: LeasePolicy, wrap: Any) -> None:
        self.booking = booking
        super().__init__(hosts, leases=leases, wrap=wrap)

    def close(self) -> None:
        try:
            super().close()  # the agents exit, their kernel leases with them: the place is clean
        finally:
            self.booking.end()


def _double_booked(place: str, settings: LabgridConfig, who: str, exc: LeaseTimeout) -> str:
    host, holder = next(iter(exc.holders.items()), ("?", {}))
    return (f"labgrid double-booked place {place} (coordinator {settings.coordinator}): it gave the place to {who}, "
            f"but host {host} is leased by {describe_holder(holder)} (the kernel's lease; a restarted coordinator "
            "forgets its locks, and any identity can release a place): nothing ran on it")


def placed_backend(config: pytest.Config) -> HilBackend:
    """The session's HilBackend on the labgrid place this process booked (see the module's doc)."""
    from hil.scheduling.booking import Booking, LabgridError
    from hil.scheduling.coordinator import CoordinatorError
    from hil.scheduling.places import place_hosts

    settings = check_labgrid(config)
    identity = current_identity(run_id(config), worker_id(config))
    notify = notifier(config)
    booking = Booking(settings, identity, lease_timeout(config), notify)
    _end_at_exit(config, booking)
    try:
        place = booking.take()
        assert booking.session is not None
        try:
            resources = booking.session.resources()
        except CoordinatorError as exc:
            raise LabgridError(f"labgrid coordinator {settings.coordinator}: {exc.reason}") from None
        hosts = place_hosts(place, resources, _inventory(config))
        notify(f"san: labgrid place {place.name} acquired by {identity.name}: hosts "
               f"{', '.join(h.name for h in hosts)}")
        policy = LeasePolicy(request=LeaseRequest(worker=identity.worker, run=identity.run), count=None,
                             timeout=0.0, notify=notify)
        try:
            backend = PlacedBackend(hosts, booking=booking, leases=policy, wrap=wrappers(config))
        except LeaseTimeout as exc:
            raise LabgridError(_double_booked(place.name, settings, identity.describe(), exc)) from None
    except BaseException:  # a timeout, a double booking, a place that is no hosts: given back at once
        booking.end()
        raise
    workeroutput: dict[str, Any] | None = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[WORKEROUTPUT_LEASES] = backend.lease_log.records
    _PLACED[id(config)] = backend
    return backend


_PLACED: dict[int, HilBackend] = {}  # config -> its placed backend, for a SIGTERM


def _end_at_exit(config: pytest.Config, booking: Any) -> None:
    """Cancel and release on unconfigure, at exit and on SIGTERM too (each idempotent)."""

    def finish() -> None:
        backend = _PLACED.pop(id(config), None)
        if backend is not None:
            with contextlib.suppress(Exception):  # best effort on the way out; the booking still ends
                backend.close()  # the agents first: the next holder must find the hosts free
        booking.end()

    config.add_cleanup(finish)
    atexit.register(booking.end)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        finish()
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            handler: Callable[[int, FrameType | None], Any] = previous
            handler(signum, frame)
        elif previous != signal.SIG_IGN:
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
