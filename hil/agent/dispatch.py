"""Requests to engine objects: the agent's side of the controller <-> agent protocol.

An engine (emulator or verbs) hands out objects that follow pytest_san's protocols. The methods each
kind answers are ``hil.rpc.methods.OBJECTS``; values travel by ``hil.rpc.codec``, with
:class:`EngineCodec` naming the engine's objects; errors by ``hil.rpc.errors``. Python 3.9 compatible,
standard library (+ pytest_san's types, pushed with the agent).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hil.rpc import framing as wire
from hil.rpc.codec import Codec, ForeignInt, Opaque, buffer_ref, object_id, object_ref, referenced
from hil.rpc.errors import ProtocolError, describe
from hil.rpc.methods import OBJECTS
from pytest_san.types import DeviceDescription

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


class EngineCodec(Codec):
    """The agent's side of the codec: an engine's objects go out as references (and its completions,
    registrations and buffers as plain values), references come back as the objects they name."""

    description = DeviceDescription

    def __init__(self, registry: Registry, resolve_buffer: Callable[[Any, int, int], object]) -> None:
        self.registry = registry
        self._resolve_buffer = resolve_buffer

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

    def owner(self, owner: object, *, foreign: bool) -> object:
        if foreign:  # memory of a process on another host
            return ForeignProcess(str(owner))
        return self.registry.get(object_id(owner))

    def buffer(self, process: object, address: object, length: object) -> object:
        if type(address) is int and type(length) is int:
            return self._resolve_buffer(process, address, length)
        return RawBuffer(process, address, length)  # for the engine to refuse, in its own order


class Dispatcher:
    """Turns one request into one reply."""

    def __init__(self, codec: EngineCodec, handlers: dict[tuple[str, str], Callable[..., object]]) -> None:
        self.codec = codec
        self.registry = codec.registry
        self._handlers = handlers  # (kind, method) answered by a function instead of an attribute

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
            obj, method, args = request.get("obj"), request.get("method"), request.get("args", [])
            if not isinstance(method, str) or not isinstance(args, list):
                raise ProtocolError(f"a request is {{id, obj, method, args: [...]}}, got {request!r:.200}")
            target = self.registry.get(object_id(obj))
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
            return {"id": rid, "result": self.codec.encode(result)}
        except Exception as exc:  # every failure goes back to the controller, named
            return {"id": rid, "error": describe(exc, with_traceback=True)}


def _readable_id(line: bytes) -> int | str | None:
    """The id of a request that could not be read as a whole, if it has a plain one; else None."""
    try:
        rid = json.loads(line).get("id")
    except Exception:  # not JSON, or not an object
        return None
    return rid if isinstance(rid, (int, str)) else None
