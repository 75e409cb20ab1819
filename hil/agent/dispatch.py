"""Requests to engine objects: which methods each kind of object answers, and how values travel.

An engine (emulator or verbs) hands out objects that follow pytest_san's protocols; this module
is the only place that knows how they map onto the wire. Python 3.9 compatible, standard library.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from typing import Any

from hil.rpc import framing as wire

# The methods each kind of remote object answers: the protocol's surface, nothing more.
METHODS = {
    "engine": {"hello", "connect_local", "socket_create", "socket_connect", "peer_closed", "leaks", "reset",
               "faults"},
    "node": {"spawn_process", "default_process"},
    "process": {"alloc", "read", "write", "buffer_read", "buffer_write", "kill", "alive"},
    "provider": {"register_memory", "deregister_memory", "register_rdma_memory", "deregister_rdma_memory",
                 "rdma_write", "rdma_read", "rdma_write_burst", "rdma_read_burst", "send", "recv", "close_socket",
                 "getsockopt", "registrations", "supports_rdma_read"},
    "proxy": {"device_flags", "nolowmem", "set_nolowmem", "allocate", "free", "allocate_contiguous",
              "free_contiguous", "get_dma_adapter", "put_dma_adapter", "live_allocations"},
    "adapter": {"allocate_common_buffer", "free_common_buffer", "dma32"},
    "socket": {"state"},
    "operation": {"done", "wait"},
    "allocation": {"info"},
}


class ProtocolError(Exception):
    """A request line that is not a well-formed request: answered with an error, never fatal."""


class Opaque:
    """An argument the controller could not send as itself (an object of its own process, another
    host's object): to the engine, an object it knows nothing of, as it would be in-process."""

    def __init__(self, shown: str) -> None:
        self._shown = shown

    def __repr__(self) -> str:
        return self._shown


class ForeignInt(int):
    """An int subclass (an enum of another type, say) sent as an argument: still an int, not an ``int``."""

    _shown = ""

    @classmethod
    def make(cls, value: int, shown: str) -> ForeignInt:
        number = cls(value)
        number._shown = shown
        return number

    def __repr__(self) -> str:
        return self._shown or int.__repr__(self)


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

    def __init__(self, process: Any, address: Any, length: Any) -> None:
        self.process = process
        self.address = address
        self.length = length

    def __repr__(self) -> str:
        return f"<buffer of {self.process!r} at {self.address!r:.40}+{self.length!r:.40}>"


class Registry:
    """Object ids for everything the controller holds a reference to."""

    def __init__(self, kind_of: Callable[[Any], str]) -> None:
        self._kind_of = kind_of
        self._objects: dict[int, Any] = {}
        self._ids: dict[int, int] = {}
        self._next = 1
        self.pinned: set[int] = set()  # survive reset (engine, nodes, providers, proxies)

    def ref(self, obj: Any) -> dict[str, Any]:
        oid = self._ids.get(id(obj))
        if oid is None:
            oid = self._next
            self._next += 1
            self._objects[oid] = obj
            self._ids[id(obj)] = oid
        return {"$o": oid, "type": self._kind_of(obj)}

    def get(self, oid: int) -> Any:
        try:
            return self._objects[oid]
        except KeyError:
            raise LookupError(f"no object {oid} on this agent (stale after a reset?)") from None

    def forget_unpinned(self) -> None:
        for oid in [o for o in self._objects if o not in self.pinned]:
            del self._ids[id(self._objects.pop(oid))]


class Dispatcher:
    """Turns one request into one reply."""

    def __init__(self, registry: Registry, resolve_buffer: Callable[[Any, int, int], Any],
                 encode_result: Callable[[Any], Any],
                 handlers: dict[tuple[str, str], Callable[..., Any]]) -> None:
        self.registry = registry
        self._resolve_buffer = resolve_buffer
        self._encode_result = encode_result
        self._handlers = handlers  # (kind, method) answered by a function instead of an attribute

    def _arg(self, value: Any) -> Any:
        if isinstance(value, dict):
            if "$o" in value:
                return self.registry.get(_object_id(value["$o"]))
            if "$buf" in value or "$fbuf" in value:
                ref = value.get("$buf", value.get("$fbuf"))
                if not isinstance(ref, list) or len(ref) != 3:
                    raise ProtocolError(f"a buffer reference is [process, address, length], got {ref!r:.80}")
                owner, address, length = ref
                if "$fbuf" in value:  # memory of a process on another host
                    process: Any = ForeignProcess(str(owner))
                else:
                    process = self.registry.get(_object_id(owner))
                address, length = self._arg(address), self._arg(length)
                if type(address) is int and type(length) is int:
                    return self._resolve_buffer(process, address, length)
                return RawBuffer(process, address, length)  # for the engine to refuse, in its own order
            if "$x" in value:
                return Opaque(str(value["$x"]))
            if "$i" in value:
                ref = value["$i"]
                if not isinstance(ref, list) or len(ref) != 2 or type(ref[0]) is not int:
                    raise ProtocolError(f"an int subclass is [value, repr], got {ref!r:.80}")
                return ForeignInt.make(ref[0], str(ref[1]))
            return {k: self._arg(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._arg(v) for v in value]
        return value

    def handle_line(self, line: bytes) -> bytes:
        """One request line -> one reply line. Whatever is wrong with the line, the answer is an error
        reply (with the request's id where it could be read) and the agent keeps serving: exiting would
        drop every registration it holds."""
        try:
            request = wire.decode(line)
        except Exception as exc:  # not JSON, not an object, bad base64, nested too deep
            reply: dict[str, Any] = {"id": _readable_id(line), "error": describe(
                ProtocolError(f"not a request ({type(exc).__name__}: {exc}): {line[:200]!r}"))}
        else:
            reply = self.handle(request)
        try:
            return wire.encode(reply)
        except Exception as exc:  # a result JSON cannot carry: say so rather than die
            return wire.encode({"id": _readable_id(line), "error": describe(exc)})

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        rid = request.get("id")
        try:
            obj, method, args = request.get("obj"), request.get("method"), request.get("args", [])
            if not isinstance(method, str) or not isinstance(args, list):
                raise ProtocolError(f"a request is {{id, obj, method, args: [...]}}, got {request!r:.200}")
            target = self.registry.get(_object_id(obj))
            kind = self.registry.ref(target)["type"]
            if method not in METHODS.get(kind, ()):
                raise LookupError(f"a {kind} has no method {method!r}")
            args = [self._arg(a) for a in args]
            handler = self._handlers.get((kind, method))
            if handler is not None:
                result = handler(target, *args)
            else:
                result = getattr(target, method)
                if callable(result):
                    result = result(*args)
            if (kind, method) == ("engine", "reset"):
                self.registry.forget_unpinned()  # the controller forgets them too
            return {"id": rid, "result": self._encode_result(result)}
        except Exception as exc:  # every failure goes back to the controller, named
            return {"id": rid, "error": describe(exc)}


def _object_id(value: Any) -> int:
    if type(value) is not int:  # not True, which would be object 1
        raise ProtocolError(f"an object id is an int, got {value!r:.80}")
    return value


def _readable_id(line: bytes) -> Any:
    """The id of a request that could not be read as a whole, if it has a plain one; else None."""
    try:
        rid = json.loads(line).get("id")
    except Exception:  # not JSON, or not an object
        return None
    return rid if isinstance(rid, (int, str)) else None


def describe(exc: BaseException) -> dict[str, Any]:
    code = getattr(exc, "code", None)
    error: dict[str, Any] = {"kind": type(exc).__name__, "message": str(exc)}
    if code is not None and type(exc).__name__ == "SanError":
        error["code"] = int(code)
        error["required_size"] = getattr(exc, "required_size", None)
        error["message"] = exc.args[0] if exc.args else str(exc)
    elif type(exc).__name__ not in ("ValueError", "TimeoutError", "LookupError", "TypeError", "ProtocolError"):
        error["traceback"] = traceback.format_exc(limit=8)
    return error
