"""Requests to engine objects: the agent's side of the controller <-> agent protocol.

An engine (emulator or verbs) hands out objects that follow pytest_san's protocols. The methods each
kind answers are ``hil.rpc.methods.OBJECTS``; values travel by ``hil.rpc.codec``, with
:class:`EngineCodec` naming the engine's objects; errors by ``hil.rpc.errors``. Python 3.9 compatible,
standard library (+ ``pytest_san.spi``, pushed with the agent).
"""

from __future__ import annotations

import collections
import enum
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from hil.rpc import framing as wire
from hil.rpc.codec import Codec, ForeignInt, Opaque, buffer_ref, object_id, object_ref, referenced
from hil.rpc.errors import ProtocolError, describe
from hil.rpc.methods import OBJECTS
from pytest_san.spi.contract import DeviceDescription

if TYPE_CHECKING:
    from hil.rpc.codec import Encoded

__all__ = ["Dispatcher", "EngineCodec", "ForeignInt", "ForeignProcess", "Opaque", "ProtocolError", "RawBuffer",
           "Registry"]


class ForeignProcess:
    """The owner of another host's buffer: a process no engine here knows (so, WSAEFAULT)."""

    alive = True

    def __init__(self, host: str) -> None:
        self.host = host
        self.pid = f"(a process on {host})"

    def buffer_at(self, address: int, length: int) -> RawBuffer:
        return RawBuffer(self, address, length)

    def __repr__(self) -> str:
        return f"<process on {self.host}>"


class RawBuffer:
    """A buffer as the controller described it (process, address, length), fields unchecked."""

    def __init__(self, process: object, address: object, length: object) -> None:
        self.process = process
        self.address = address
        self.length = length

    def __repr__(self) -> str:
        return f"<buffer of {self.process!r} at {self.address!r:.40}+{self.length!r:.40}>"


class Registry:
    """Object ids for everything the controller holds a reference to."""

    def __init__(self, kind_of: Callable[[object], str]) -> None:
        self.kind_of = kind_of
        self._objects: dict[int, object] = {}
        self._ids: dict[int, int] = {}
        self._next = 1
        self.pinned: set[int] = set()  # survive reset (engine, nodes, providers, proxies)

    def ref(self, obj: object) -> dict[str, Encoded]:
        oid = self._ids.get(id(obj))
        if oid is None:
            oid = self._next
            self._next += 1
            self._objects[oid] = obj
            self._ids[id(obj)] = oid
        return object_ref(oid, self.kind_of(obj))

    def pin(self, obj: object) -> None:
        """``obj`` keeps its id across resets (engine, nodes, providers, proxies)."""
        self.pinned.add(referenced(self.ref(obj)))

    def get(self, oid: int) -> object:
        """The object of ``oid``: an engine object, whatever its kind."""
        try:
            return self._objects[oid]
        except KeyError:
            raise LookupError(f"no object {oid} on this agent (stale after a reset?)") from None

    def forget_unpinned(self) -> None:
        for oid in [o for o in self._objects if o not in self.pinned]:
            del self._ids[id(self._objects.pop(oid))]


KEPT = 1024
"""Results of the latest requests kept for later requests to name (``{"$r": id}``): calls made together name
the results of calls before them in the same group, far fewer than this."""


class Earlier:
    """The outcomes of the latest requests, by request id: what ``{"$r": id}`` names."""

    def __init__(self) -> None:
        self._outcomes: collections.OrderedDict[object, tuple[bool, object]] = collections.OrderedDict()

    def keep(self, rid: object, ok: bool, value: object) -> None:
        if isinstance(rid, (int, str)):
            self._outcomes[rid] = (ok, value)
            while len(self._outcomes) > KEPT:
                self._outcomes.popitem(last=False)

    def get(self, rid: object) -> object:
        found = self._outcomes.get(rid) if isinstance(rid, (int, str)) else None
        if found is None:
            raise ProtocolError(f"no result of request {rid!r:.40} is kept (only the latest {KEPT} are)")
        ok, value = found
        if not ok:
            raise LookupError(f"request {rid} failed, and this one names its result: {value!r:.200}")
        return value

    def clear(self) -> None:
        self._outcomes.clear()


class EngineCodec(Codec):
    """The agent's side of the codec: an engine's objects go out as references (and its completions,
    registrations and buffers as plain values), references come back as the objects they name, and an
    earlier request's ``{"$r": id}`` as what it returned."""

    description = DeviceDescription

    def __init__(self, registry: Registry, resolve_buffer: Callable[[Any, int, int], object]) -> None:
        self.registry = registry
        self._resolve_buffer = resolve_buffer
        self.results = Earlier()

    def own(self, value: Any) -> Encoded:  # whatever an engine answers, duck-typed
        if isinstance(value, enum.Enum):
            return int(value) if isinstance(value, int) else self.encode(value.value)
        if isinstance(value, int):
            return int(value)  # an engine's int subclass: an int to the controller
        if hasattr(value, "status") and hasattr(value, "bytes"):
            return {"status": value.status.value, "bytes": value.bytes}
        if hasattr(value, "process") and hasattr(value, "address") and hasattr(value, "length"):
            return buffer_ref(referenced(self.registry.ref(value.process)), value.address, value.length)
        if hasattr(value, "refs") and hasattr(value, "kind"):
            return {"kind": value.kind, "address": value.address, "length": value.length,
                    "access": int(value.access), "refs": value.refs}
        if self.registry.kind_of(value) in OBJECTS:
            return self.registry.ref(value)
        return None

    def opaque(self, value: object) -> Encoded:
        return str(value)

    def resolve(self, oid: int) -> object:
        return self.registry.get(oid)

    def earlier(self, rid: object) -> object:
        return self.results.get(rid)

    def owner(self, owner: object, *, foreign: bool) -> object:
        if foreign:  # memory of a process on another host
            return ForeignProcess(str(owner))
        return self.registry.get(object_id(owner))

    def buffer(self, process: object, address: object, length: object) -> object:
        if type(address) is int and type(length) is int:
            return self._resolve_buffer(process, address, length)
        return RawBuffer(process, address, length)  # for the engine to refuse, in its own order


class Prefetch(Protocol):
    """An engine's read-only requests asked ahead: ``ask`` writes ahead what answering a request will ask (True
    if it is such a request), ``forget`` drops what nobody took."""

    def ask(self, kind: str, method: str, target: Any, args: list[Any]) -> bool: ...
    def forget(self) -> None: ...


class Dispatcher:
    """Turns one request into one reply."""

    def __init__(self, codec: EngineCodec, handlers: dict[tuple[str, str], Callable[..., object]],
                 prefetch: Prefetch | None = None) -> None:
        """``prefetch``: the engine's way to ask read-only requests ahead (verbs: of its children), if it has one."""
        self.codec = codec
        self.registry = codec.registry
        self._handlers = handlers  # (kind, method) answered by a function instead of an attribute
        self._prefetch = prefetch

    def handle_lines(self, lines: list[bytes]) -> Iterator[bytes]:
        """The replies to requests that arrived together, in order. The engine may ask a run of read-only ones
        ahead (the verbs engine writes them to its children at once); before a request that is not one, nothing
        asked ahead is used any more, so each request still sees what those before it did."""
        ahead = 0  # requests from here on are asked ahead already
        for index, line in enumerate(lines):
            if self._prefetch is not None and index >= ahead:
                ahead = index
                while ahead < len(lines) and self._asked_ahead(lines[ahead]):
                    ahead += 1
                if ahead == index:
                    self._prefetch.forget()
            yield self.handle_line(line)
        if self._prefetch is not None:
            self._prefetch.forget()

    def _asked_ahead(self, line: bytes) -> bool:
        """Whether the request of ``line`` is read-only and was asked ahead (anything odd: it was not)."""
        assert self._prefetch is not None
        try:
            request = wire.decode(line)
            obj, method, args = request.get("obj"), request.get("method"), request.get("args", [])
            if type(obj) is not int or not isinstance(method, str) or not isinstance(args, list):
                return False
            target = self.registry.get(obj)
            return self._prefetch.ask(self.registry.kind_of(target), method, target, self.codec.decode(args))
        except Exception:  # judged when it is handled
            return False

    def handle_line(self, line: bytes) -> bytes:
        """One request line -> one reply line. Whatever is wrong with the line, the answer is an error
        reply (with the request's id where it could be read) and the agent keeps serving: exiting would
        drop every registration it holds."""
        try:
            request = wire.decode(line)
        except Exception as exc:  # not JSON, not an object, bad base64, nested too deep
            reply: dict[str, object] = {"id": _readable_id(line), "error": describe(
                ProtocolError(f"not a request ({type(exc).__name__}: {exc}): {line[:200]!r}"), with_traceback=True)}
        else:
            reply = self.handle(request)
        try:
            return wire.encode(reply)
        except Exception as exc:  # a result JSON cannot carry: say so rather than die
            return wire.encode({"id": _readable_id(line), "error": describe(exc, with_traceback=True)})

    def handle(self, request: dict[str, Any]) -> dict[str, object]:
        rid = request.get("id")
        try:
            result = self._answer(request)
        except Exception as exc:  # every failure goes back to the controller, named
            self.codec.results.keep(rid, False, exc)
            return {"id": rid, "error": describe(exc, with_traceback=True)}
        self.codec.results.keep(rid, True, result)
        try:
            return {"id": rid, "result": self.codec.encode(result)}
        except Exception as exc:
            return {"id": rid, "error": describe(exc, with_traceback=True)}

    def _answer(self, request: dict[str, Any]) -> object:
        """What the request's method returns (an engine's object or value: arbitrary)."""
        obj, method, args = request.get("obj"), request.get("method"), request.get("args", [])
        if not isinstance(method, str) or not isinstance(args, list):
            raise ProtocolError(f"a request is {{id, obj, method, args: [...]}}, got {request!r:.200}")
        # The target is an object the agent named, or what an earlier request returned ({"$r": id}).
        target = self.codec.decode(obj) if isinstance(obj, dict) and "$r" in obj else self.registry.get(object_id(obj))
        kind = self.registry.kind_of(target)
        if method not in OBJECTS.get(kind, ()):
            raise LookupError(f"a {kind} has no method {method!r}")
        args = self.codec.decode(args)
        handler = self._handlers.get((kind, method))
        if handler is not None:
            result = handler(target, *args)
        else:
            result = getattr(target, method)
            if callable(result):
                result = result(*args)
        if (kind, method) == ("engine", "reset"):
            self.registry.forget_unpinned()  # the controller forgets them too
            self.codec.results.clear()
        return result


def _readable_id(line: bytes) -> int | str | None:
    """The id of a request that could not be read as a whole, if it has a plain one; else None."""
    try:
        rid = json.loads(line).get("id")
    except Exception:  # not JSON, or not an object
        return None
    return rid if isinstance(rid, (int, str)) else None
