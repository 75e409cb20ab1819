"""The one module that imports labgrid: a typed, synchronous session with a labgrid coordinator.

labgrid's client (``labgrid.remote.client.ClientSession``) is asyncio and untyped. Here it runs on an event
loop of its own, in a daemon thread, so that the pytest side (and a signal handler, or atexit) can call it
from any thread; what it returns is turned into the frozen values below at once, inside that loop, so that
nothing of labgrid's leaks into the typed side. Every failure is a :class:`CoordinatorError` whose message
names the coordinator's address.

The session's name is labgrid's ``host/user`` (what its lock and reservations belong to); it is passed in,
never taken from ``LG_HOSTNAME``/``LG_USERNAME``, so that one process can hold sessions of several names (a
worker, the reaper) without touching its environment.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "DEFAULT_PORT",
    "CoordinatorError",
    "CoordinatorSession",
    "PlaceView",
    "ReservationView",
    "ResourceView",
    "labgrid_version",
]

DEFAULT_PORT = 20408  # labgrid's
CONNECT_TIMEOUT = 30.0  # seconds to reach the coordinator and sync once
CALL_TIMEOUT = 30.0  # seconds any one call may take

T = TypeVar("T")

ResourcePath = tuple[str, str, str, str]
"""(exporter, group, class, name): a resource as the coordinator names it."""


class CoordinatorError(Exception):
    """The coordinator could not be reached, or refused a call; the message names its address."""

    def __init__(self, address: str, message: str, *, gone: bool = False) -> None:
        super().__init__(f"labgrid coordinator {address}: {message}")
        self.address = address
        self.reason = message
        self.gone = gone  # the coordinator is unreachable (not: it refused the call)


@dataclass(frozen=True)
class ResourceView:
    path: ResourcePath
    params: Mapping[str, object] = field(hash=False)
    acquired: str | None  # the place that acquired it
    available: bool

    @property
    def cls(self) -> str:
        return self.path[2]

    def text(self) -> str:
        return "/".join(self.path[:3])


@dataclass(frozen=True)
class PlaceView:
    name: str
    tags: Mapping[str, str] = field(hash=False)
    acquired: str | None  # the session name (host/user) that acquired it
    changed: float  # time.time() of the place's last change (an acquire, a release)
    reservation: str | None  # the token of the reservation it is allocated to
    matches: tuple[tuple[str, str | None], ...]  # (pattern exporter/group/cls[/name], rename)
    acquired_resources: tuple[tuple[ResourcePath, str | None], ...]  # (path, rename) while acquired

    def matches_filter(self, wanted: Mapping[str, str]) -> bool:
        """As labgrid's scheduler: every tag of the filter, or ``name=PLACE``."""
        return all(self.tags.get(k) == v or (k == "name" and v == self.name) for k, v in wanted.items())


@dataclass(frozen=True)
class ReservationView:
    token: str
    owner: str
    state: str  # waiting, allocated, acquired, expired, invalid
    prio: float
    filters: Mapping[str, str] = field(hash=False)
    place: str | None  # the allocated place
    created: float


def labgrid_version() -> str:
    from labgrid import __version__

    return str(__version__)


def _place(place: Any) -> PlaceView:
    acquired = tuple(((str(p[0]), str(p[1]), str(p[2]), str(p[3])), _rename(place, p))
                     for p in place.acquired_resources)
    return PlaceView(
        name=str(place.name), tags={str(k): str(v) for k, v in place.tags.items()},
        acquired=str(place.acquired) if place.acquired else None, changed=float(place.changed),
        reservation=str(place.reservation) if place.reservation else None,
        matches=tuple((f"{m.exporter}/{m.group}/{m.cls}" + (f"/{m.name}" if m.name else ""),
                       str(m.rename) if m.rename else None) for m in place.matches),
        acquired_resources=acquired,
    )


def _rename(place: Any, path: Sequence[str]) -> str | None:
    match = place.getmatch(tuple(path))
    return str(match.rename) if match is not None and match.rename else None


def _reservation(res: Any) -> ReservationView:
    allocated = res.allocations.get("main") or []
    return ReservationView(token=str(res.token), owner=str(res.owner), state=str(res.state.name),
                           prio=float(res.prio), filters={str(k): str(v) for k, v in res.filters.get("main",
                                                                                                      {}).items()},
                           place=str(allocated[0]) if allocated else None, created=float(res.created))


class CoordinatorSession:
    """A client session named ``name`` (``host/user``) with the coordinator at ``address`` (HOST[:PORT])."""

    def __init__(self, address: str, name: str, *, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        if "/" not in name or name.count("/") != 1:
            raise ValueError(f"a labgrid session name is host/user, got {name!r}")
        self.given = address
        self.name = name
        self.address = address
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="san-labgrid", daemon=True)
        self._thread.start()
        self._session: Any = None
        try:
            self._connect(connect_timeout)
        except BaseException:
            self._stop_loop()
            raise

    # --- plumbing -----------------------------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        if self._loop.is_closed():
            coro.close()
            raise CoordinatorError(self.address, "the session is closed", gone=True)
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise CoordinatorError(self.address, f"no answer within {timeout:g} s", gone=True) from None

    def _error(self, exc: BaseException) -> CoordinatorError:
        if isinstance(exc, CoordinatorError):
            return exc
        import grpc

        if isinstance(exc, grpc.aio.AioRpcError):
            gone = exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            details = exc.details() or exc.code().name
            return CoordinatorError(self.address, " ".join(str(details).split()), gone=gone)
        return CoordinatorError(self.address, f"{type(exc).__name__}: {exc}")

    def _connect(self, timeout: float) -> None:
        from labgrid.remote.client import ClientSession
        from labgrid.util.proxy import proxymanager

        host, user = self.name.split("/")
        try:
            self.address = str(proxymanager.get_grpc_address(self.given, default_port=DEFAULT_PORT))
        except Exception as exc:  # a bad address, or LG_PROXY's forward failing
            raise CoordinatorError(self.given, f"{type(exc).__name__}: {exc}", gone=True) from None

        address = self.address

        async def start() -> Any:
            session = ClientSession(address=address, loop=asyncio.get_running_loop())
            session.gethostname = lambda: host  # the name its locks and reservations belong to
            session.getuser = lambda: user
            try:
                await asyncio.wait_for(session.start(), timeout)
            except BaseException:
                await self._close_session(session)
                raise
            return session

        try:
            self._session = self._run(start(), timeout + 5)
        except (asyncio.TimeoutError, concurrent.futures.TimeoutError):
            raise CoordinatorError(self.address, f"no answer within {timeout:g} s", gone=True) from None
        except CoordinatorError:
            raise
        except Exception as exc:
            why = str(exc) or type(exc).__name__
            if "Could not connect" in why:
                why = "nothing answers there (is labgrid-coordinator running, and the address right?)"
            raise CoordinatorError(self.address, why, gone=True) from None

    @staticmethod
    async def _close_session(session: Any) -> None:
        # best effort: the session is going anyway
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(session.stop(), 5)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(session.close(), 5)

    @property
    def alive(self) -> bool:
        """False once the coordinator went away (its stream ended): a new session is needed."""
        return self._session is not None and not self._session.stopping.is_set()

    def reconnect(self, timeout: float = CONNECT_TIMEOUT) -> None:
        old, self._session = self._session, None
        if old is not None:
            with contextlib.suppress(CoordinatorError):
                self._run(self._close_session(old), 15)
        self._connect(timeout)

    async def _call(self, method: str, request: Any) -> Any:
        stub = self._session.stub
        return await getattr(stub, method)(request, timeout=CALL_TIMEOUT)

    def _rpc(self, method: str, request_type: str, **fields: Any) -> Any:
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

        if not self.alive:
            raise CoordinatorError(self.address, "the connection to the coordinator was lost", gone=True)
        request = getattr(pb2, request_type)(**fields)
        try:
            return self._run(self._call(method, request))
        except Exception as exc:
            raise self._error(exc) from None

    # --- what the coordinator knows ----------------------------------------------------------------------

    def places(self) -> dict[str, PlaceView]:
        """Every place, as the coordinator knows it now."""
        async def read() -> dict[str, PlaceView]:
            if not await self._session.sync_with_coordinator():
                raise CoordinatorError(self.address, "the connection to the coordinator was lost", gone=True)
            return {name: _place(place) for name, place in self._session.places.items()}

        try:
            return self._run(read())
        except Exception as exc:
            raise self._error(exc) from None

    def resources(self) -> dict[ResourcePath, ResourceView]:
        """Every resource the exporters announce."""
        async def read() -> dict[ResourcePath, ResourceView]:
            if not await self._session.sync_with_coordinator():
                raise CoordinatorError(self.address, "the connection to the coordinator was lost", gone=True)
            found: dict[ResourcePath, ResourceView] = {}
            for exporter, groups in self._session.resources.items():
                for group, entries in groups.items():
                    for name, entry in entries.items():
                        if "cls" not in entry.data:
                            continue  # deleted
                        path = (str(exporter), str(group), str(entry.cls), str(name))
                        found[path] = ResourceView(path, dict(entry.params), entry.acquired or None,
                                                   bool(entry.avail))
            return found

        try:
            return self._run(read())
        except Exception as exc:
            raise self._error(exc) from None

    def reservations(self) -> list[ReservationView]:
        from labgrid.remote.common import Reservation

        response = self._rpc("GetReservations", "GetReservationsRequest")
        return [_reservation(Reservation.from_pb2(r)) for r in response.reservations]

    # --- reservations and places -------------------------------------------------------------------------

    def reserve(self, tags: Mapping[str, str], prio: float) -> ReservationView:
        from labgrid.remote.common import Reservation
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

        filters = {"main": pb2.Reservation.Filter(filter=dict(tags))}
        response = self._rpc("CreateReservation", "CreateReservationRequest", filters=filters, prio=prio)
        return _reservation(Reservation.from_pb2(response.reservation))

    def poll(self, token: str) -> ReservationView | None:
        """The reservation now (polling keeps a waiting one from expiring); None if the coordinator has none
        of that token (cancelled, expired, or lost in a restart)."""
        from labgrid.remote.common import Reservation

        try:
            response = self._rpc("PollReservation", "PollReservationRequest", token=token)
        except CoordinatorError as exc:
            if "does not exist" in exc.reason:
                return None
            raise
        return _reservation(Reservation.from_pb2(response.reservation))

    def cancel(self, token: str) -> bool:
        """Cancel reservation ``token``: False if the coordinator has none of that token."""
        try:
            self._rpc("CancelReservation", "CancelReservationRequest", token=token)
        except CoordinatorError as exc:
            if "does not exist" in exc.reason:
                return False
            raise
        return True

    def acquire(self, place: str) -> None:
        self._rpc("AcquirePlace", "AcquirePlaceRequest", placename=place)

    def release_from(self, place: str, user: str) -> None:
        """Release ``place`` only if ``user`` (a session name) holds it: labgrid's ``release-from``, which does
        nothing (and says nothing) when another holds it or no one does."""
        self._rpc("ReleasePlace", "ReleasePlaceRequest", placename=place, fromuser=user)

    def add_place(self, name: str, matches: Sequence[tuple[str, str | None]], tags: Mapping[str, str]) -> None:
        """Create place ``name`` with ``matches`` ((pattern, rename or None)) and ``tags`` (what
        ``labgrid-client -p NAME create``, ``add-named-match`` and ``set-tags`` do)."""
        self._rpc("AddPlace", "AddPlaceRequest", name=name)
        for pattern, rename in matches:
            fields: dict[str, str] = {"placename": name, "pattern": pattern}
            if rename:
                fields["rename"] = rename
            self._rpc("AddPlaceMatch", "AddPlaceMatchRequest", **fields)
        if tags:
            self._rpc("SetPlaceTags", "SetPlaceTagsRequest", placename=name, tags=dict(tags))

    # --- the end -----------------------------------------------------------------------------------------

    def _stop_loop(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            if not self._thread.is_alive():
                self._loop.close()

    def close(self) -> None:
        """End the session (what it acquired stays acquired: release first). Idempotent."""
        session, self._session = self._session, None
        if session is not None and not self._loop.is_closed():
            with contextlib.suppress(CoordinatorError):
                self._run(self._close_session(session), 15)
        self._stop_loop()
