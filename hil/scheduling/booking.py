"""One process's place: a reservation by filter and priority, waited for, acquired; at the end, cancelled and
then released.

labgrid hands a freed place to the next waiter at once only when its holder cancels its reservation before it
releases the place (the other way round it waits for the coordinator's 15 s tick, and a place released but
never cancelled stays reserved 90 s): :meth:`Booking.end` cancels first. While waiting it prints who holds each
place of the filter whenever that changes, and it gives up (cancelling) after ``timeout`` seconds
(``--san-lease-timeout``) naming them. A coordinator that goes away while we wait is reconnected to, and a
reservation it forgot (a restart) is made again, within the same deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from hil.scheduling.config import Identity, LabgridConfig, identity_of
from hil.scheduling.coordinator import CoordinatorError, CoordinatorSession, PlaceView, ReservationView

__all__ = ["Booking", "LabgridError", "LabgridTimeout", "describe_name", "holders_text"]

log = logging.getLogger(__name__)

POLL = 0.5  # seconds between polls of a waiting reservation
RECONNECT_PAUSE = 1.0


class LabgridError(Exception):
    """The run cannot get its place: one line, naming the coordinator (and the place, the option); pytest-san
    reports it as the backend's failure (``san: the hil backend could not be built: ...``)."""


class LabgridTimeout(LabgridError):
    """No place of the filter within the lease timeout; the message names who holds each."""


def describe_name(name: str) -> str:
    """A labgrid session name as a person reads it: a pytest-san identity's worker, run and controller."""
    ident = identity_of(name)
    return f"{ident.describe()} [{name}]" if ident is not None else name


def _since(at: float) -> str:
    return datetime.fromtimestamp(at).astimezone().isoformat(timespec="seconds")


def holders_text(places: Mapping[str, PlaceView], reservations: Mapping[str, ReservationView],
                 tags: Mapping[str, str]) -> str:
    """Each place of the filter and who has it: acquired by (since), allocated to, or free."""
    parts = []
    for name in sorted(places):
        place = places[name]
        if not place.matches_filter(tags):
            continue
        if place.acquired:
            parts.append(f"{name} acquired by {describe_name(place.acquired)} since {_since(place.changed)}")
        elif place.reservation:
            owner = reservations.get(place.reservation)
            parts.append(f"{name} allocated to {describe_name(owner.owner) if owner else place.reservation}")
        else:
            parts.append(f"{name} free")
    return "; ".join(parts) if parts else "no place has these tags"


@dataclass
class Booking:
    """A place for ``identity``, by ``config``'s filter and priority."""

    config: LabgridConfig
    identity: Identity
    timeout: float
    notify: Callable[[str], None]
    connect: Callable[[str, str], CoordinatorSession] = CoordinatorSession
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    session: CoordinatorSession | None = None
    token: str | None = None
    place: PlaceView | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ended: bool = False

    def _where(self) -> str:
        return f"labgrid coordinator {self.config.coordinator} ({self.config.source})"

    def _fail(self, exc: CoordinatorError, doing: str) -> LabgridError:
        if exc.gone:
            return LabgridError(f"cannot reach the {self._where()}: {exc.reason}")
        return LabgridError(f"the {self._where()} refused to {doing}: {exc.reason}")

    # --- taking a place --------------------------------------------------------------------------------------

    def take(self) -> PlaceView:
        """Reserve, wait until a place is allocated (at most ``timeout`` s), acquire it; the acquired place."""
        deadline = self.clock() + self.timeout
        try:
            self.session = self.connect(self.config.coordinator, self.identity.name)
        except CoordinatorError as exc:
            raise self._fail(exc, "start a session") from None
        announced = holders = ""
        lost = False
        while True:
            if self._ended:
                raise LabgridError(f"stopped while waiting for a labgrid place with {self.config.filter_text}")
            try:
                if lost:
                    self.session.reconnect()
                    lost = False
                    self.notify(f"san: the {self._where()} is back; reserving again if it forgot us")
                res = self.session.poll(self.token) if self.token else None
                if res is None or res.state in ("expired", "invalid"):
                    res = self.session.reserve(self.config.tags, self.config.priority)
                    self.token = res.token
                    log.info("labgrid reservation %s for %s", res.token, self.config.filter_text)
                if res.state == "allocated" and res.place:
                    try:
                        self.session.acquire(res.place)
                    except CoordinatorError as exc:
                        if exc.gone:
                            raise
                        log.info("acquiring %s failed (%s); polling again", res.place, exc.reason)
                    else:
                        self.place = self.session.places()[res.place]
                        return self.place
                elif res.state == "acquired" and res.place:  # ours already (a retry after a lost answer)
                    place = self.session.places().get(res.place)
                    if place is not None and place.acquired == self.identity.name:
                        self.place = place
                        return place
                holders = self._holders()
                if holders != announced:
                    announced = holders
                    self.notify(f"san: waiting for a labgrid place with {self.config.filter_text} (reservation "
                                f"{self.token}, priority {self.config.priority:g}, up to {self.timeout:g} s, "
                                f"--san-lease-timeout): {holders}")
            except CoordinatorError as exc:
                if not exc.gone:
                    self._cancel_quietly()
                    raise self._fail(exc, "reserve a place") from None
                if not lost:
                    self.notify(f"san: lost the {self._where()} ({exc.reason}); trying again until the lease "
                                "timeout")
                lost = True
                announced = ""
            if self.clock() >= deadline:
                text = "the coordinator did not answer" if lost or not holders else holders
                self._cancel_quietly()
                raise LabgridTimeout(
                    f"no labgrid place with {self.config.filter_text} within {self.timeout:g} s "
                    f"(--san-lease-timeout) from the {self._where()}: {text}")
            self.sleep(RECONNECT_PAUSE if lost else POLL)

    def _holders(self) -> str:
        assert self.session is not None
        places = self.session.places()
        reservations = {r.token: r for r in self.session.reservations()}
        return holders_text(places, reservations, self.config.tags)

    def _cancel_quietly(self) -> None:
        if self.session is not None and self.token is not None:
            try:
                self.session.cancel(self.token)
            except CoordinatorError as exc:
                log.info("cancelling reservation %s failed: %s", self.token, exc)
            self.token = None

    # --- the end -----------------------------------------------------------------------------------------------

    def end(self) -> None:
        """Cancel the reservation, then release the place (only if we still hold it: ``release-from``), then
        close the session. Idempotent; safe from atexit and a signal handler; never raises."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        session = self.session
        if session is None:
            return
        try:
            if not session.alive and (self.token or self.place):
                try:
                    session.reconnect(timeout=5)
                except CoordinatorError as exc:
                    self.notify(f"san: could not release labgrid place {self.place.name if self.place else '?'}: "
                                f"{exc}")
                    return
            if self.token is not None:
                self._cancel_quietly()
            if self.place is not None:
                try:
                    session.release_from(self.place.name, self.identity.name)
                    log.info("labgrid place %s released", self.place.name)
                except CoordinatorError as exc:
                    self.notify(f"san: could not release labgrid place {self.place.name}: {exc}")
        finally:
            session.close()
