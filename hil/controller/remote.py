"""Controller-side stand-ins for the objects an agent holds; each follows a pytest_san protocol."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from hil.controller.client import AgentClient
from pytest_san.burst import DEPTH
from pytest_san.types import Access, CacheType, Completion, DeviceDescription, Status


class Remote:
    """An object living in an agent, known by its id there."""

    def __init__(self, session: Session, oid: int) -> None:
        self.session = session
        self.oid = oid

    def _call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return self.session.call(self.oid, method, *args, timeout=timeout)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.oid} on {self.session.client.host.name}>"


class Session:
    """One agent's objects: wraps the references it returns, encodes what we send."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self._objects: dict[int, Remote] = {}
        self.pinned: set[int] = set()

    def call(self, oid: int, method: str, *args: Any, timeout: float | None = None) -> Any:
        return self.client.call(oid, method, *[self.encode(a) for a in args], timeout=timeout)

    def encode(self, value: Any) -> Any:
        """``value`` as the agent should see it: itself where JSON carries it faithfully, else a stand-in.

        The engine, not the controller, judges every argument, in its own order, so that bad input
        gets the error it gets in-process (SPEC section 6). Whatever JSON would change (a tuple's
        subclass, a memoryview, an int subclass, a dict with '$' keys, an object of this process or of
        another host) reaches it as something that is equally not what it expects.
        """
        if value is None or isinstance(value, (bool, str, float)):
            return value  # JSON's own (bool before int: True is no 1)
        if isinstance(value, (Access, CacheType)):
            return int(value)  # what the engines take for these enums: their int value
        if isinstance(value, int):
            return value if type(value) is int else {"$i": [int(value), _shown(value)]}
        if type(value) is bytes or type(value) is bytearray:
            return bytes(value)  # the wire sends bytes as base64
        if type(value) is list or type(value) is tuple:
            return [self.encode(v) for v in value]
        if isinstance(value, RemoteBuffer):
            fields = [self.encode(value.address), self.encode(value.length)]
            if value.process.session is self:
                return {"$buf": [value.process.oid, *fields]}
            # Another host's memory: a buffer of a process the engine does not know (WSAEFAULT there).
            return {"$fbuf": [value.process.session.client.host.name, *fields]}
        if isinstance(value, Remote) and value.session is self:
            return {"$o": value.oid}
        if type(value) is DeviceDescription:
            return {"$dd": {f.name: self.encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
        if type(value) is dict and all(type(k) is str and not k.startswith("$") for k in value):
            return {k: self.encode(v) for k, v in value.items()}
        return {"$x": _shown(value)}  # another host's object, or one of this process: opaque there

    def obj(self, ref: dict[str, Any], factory: type[Remote], *extra: Any) -> Any:
        oid = ref["$o"]
        found = self._objects.get(oid)
        if found is None:
            found = factory(self, oid, *extra)
            self._objects[oid] = found
        return found

    def sockets_of(self, process: RemoteProcess) -> list[RemoteSocket]:
        """The sockets of ``process`` this session knows (until a reset forgets them)."""
        return [o for o in self._objects.values() if isinstance(o, RemoteSocket) and o.process is process]

    def forget_unpinned(self) -> None:
        self._objects = {k: v for k, v in self._objects.items() if k in self.pinned}

    def buffer(self, ref: dict[str, Any]) -> RemoteBuffer:
        oid, address, length = ref["$buf"]
        process = self._objects[oid]
        assert isinstance(process, RemoteProcess)
        return RemoteBuffer(process, address, length)


def _shown(value: Any) -> str:
    """How an argument the agent gets a stand-in for shows in its error messages (as in-process)."""
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not break the call
        text = f"<{type(value).__name__} object (repr failed: {type(exc).__name__})>"
    return text[:200]


def _int(value: Any, what: str) -> int:
    """``value`` if it is an integer (an int subclass as its int, never a bool); else a TypeError naming
    ``what`` (as the emulator's process and buffer methods check it)."""
    if type(value) is int:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"{what} must be an integer, got {value!r:.80}")


class RemoteNode(Remote):
    def __init__(self, session: Session, oid: int, name: str, provider: dict[str, Any],
                 proxy: dict[str, Any]) -> None:
        super().__init__(session, oid)
        self._name = name
        self.provider = session.obj(provider, RemoteProvider)
        self.proxy = session.obj(proxy, RemoteProxy)

    @property
    def name(self) -> str:
        return self._name

    @property
    def default_process(self) -> RemoteProcess:
        process: RemoteProcess = self.session.obj(self._call("default_process"), RemoteProcess, self)
        return process

    def spawn_process(self) -> RemoteProcess:
        process: RemoteProcess = self.session.obj(self._call("spawn_process"), RemoteProcess, self)
        return process


class RemoteProcess(Remote):
    def __init__(self, session: Session, oid: int, node: RemoteNode) -> None:
        super().__init__(session, oid)
        self._node = node

    @property
    def node(self) -> RemoteNode:
        return self._node

    @property
    def pid(self) -> int:
        return self.oid

    @property
    def alive(self) -> bool:
        return bool(self._call("alive"))

    def alloc(self, nbytes: int) -> RemoteBuffer:
        return self.session.buffer(self._call("alloc", nbytes))

    def buffer_at(self, address: int, length: int) -> RemoteBuffer:
        """Any range, mapped or not, even of a negative length (providers refuse those)."""
        return RemoteBuffer(self, _int(address, "address"), _int(length, "length"))

    def kill(self) -> None:
        self._call("kill")
        # Its agent tells peers on the same host; peers on other hosts learn it from us, as for a close.
        for sock in self.session.sockets_of(self):
            if sock.on_close is not None:
                sock.on_close()
                sock.on_close = None


@dataclasses.dataclass(frozen=True)
class RemoteBuffer:
    """A range of a remote process's memory; reads and writes go to the agent."""

    process: RemoteProcess
    address: int
    length: int

    def read(self, n: int | None = None, offset: int = 0) -> bytes:
        offset = _int(offset, "offset")
        n = self.length - offset if n is None else _int(n, "n")
        if offset < 0 or n < 0 or offset + n > self.length:
            raise ValueError(f"read of {n} bytes at offset {offset} is outside a {self.length}-byte buffer")
        # The agent checks the whole buffer, as a buffer of its engine is checked (mapped, process alive).
        data: bytes = self.process._call("buffer_read", self.address, self.length, n, offset)
        return data

    def write(self, data: bytes | bytearray | memoryview, offset: int = 0) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"write takes bytes, got {data!r:.80}")
        offset = _int(offset, "offset")
        data = bytes(data)
        if offset < 0 or offset + len(data) > self.length:
            raise ValueError(f"write of {len(data)} bytes at offset {offset} "
                             f"is outside a {self.length}-byte buffer")
        self.process._call("buffer_write", self.address, self.length, data, offset)

    def view(self, offset: int, length: int) -> RemoteBuffer:
        offset, length = _int(offset, "offset"), _int(length, "length")
        if offset < 0 or length < 0 or offset + length > self.length:
            raise ValueError(f"view [{offset}, {offset + length}) is outside a {self.length}-byte buffer")
        return RemoteBuffer(self.process, self.address + offset, length)


class RemoteSocket(Remote):
    def __init__(self, session: Session, oid: int, process: RemoteProcess) -> None:
        super().__init__(session, oid)
        self._process = process
        self.on_close: Callable[[], None] | None = None  # tells the peer's host, when it is another one

    @property
    def process(self) -> RemoteProcess:
        return self._process

    @property
    def connected(self) -> bool:
        return bool(self._call("state")[0])

    @property
    def closed(self) -> bool:
        return bool(self._call("state")[1])


class RemoteOperation(Remote):
    """A pending operation; once complete, its completion is kept here and never asked for again."""

    _completion: Completion | None = None

    def done(self) -> bool:
        if self._completion is None and self._call("done"):
            self.wait(0)
        return self._completion is not None

    def wait(self, timeout: float | None = 10.0) -> Completion:
        if self._completion is None:
            # The agent waits up to ``timeout``; our own reply deadline leaves it room to answer. The
            # argument is the agent's to judge: one that is no timeout gets the default reply deadline.
            limit = None
            if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 <= timeout < 1e9:
                limit = timeout + 30
            reply = self._call("wait", timeout, timeout=limit)
            self._completion = Completion(Status(reply["status"]), reply["bytes"])
        return self._completion


@dataclasses.dataclass(frozen=True)
class RemoteRegistration:
    kind: str
    address: int
    length: int
    access: Access
    refs: int


Pairs = Sequence[tuple[Any, int]]


class RemoteProvider(Remote):
    _rdma_read: bool | None = None

    @property
    def supports_rdma_read(self) -> bool:
        if self._rdma_read is None:
            self._rdma_read = bool(self._call("supports_rdma_read"))
        return self._rdma_read

    def _op(self, method: str, *args: Any) -> RemoteOperation:
        op: RemoteOperation = self.session.obj(self._call(method, *args), RemoteOperation)
        return op

    def register_memory(self, socket: Any, buffer: Any, access: Access) -> int:
        return int(self._call("register_memory", socket, buffer, access))

    def deregister_memory(self, socket: Any, handle: int) -> None:
        self._call("deregister_memory", socket, handle)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Access,
                             descriptor_size: int | None = None) -> bytes:
        return bytes(self._call("register_rdma_memory", socket, buffer, access, descriptor_size))

    def deregister_rdma_memory(self, socket: Any, descriptor: bytes) -> None:
        self._call("deregister_rdma_memory", socket, descriptor)

    def rdma_write(self, socket: Any, local_buffers: Pairs, target_descriptor: bytes,
                   offset: int = 0) -> RemoteOperation:
        return self._op("rdma_write", socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Any, local_buffers: Pairs, source_descriptor: bytes,
                  offset: int = 0) -> RemoteOperation:
        return self._op("rdma_read", socket, local_buffers, source_descriptor, offset)

    def rdma_write_burst(self, socket: Any, local_buffers: Pairs, target_descriptor: bytes, offset: int = 0,
                         count: int = 1, depth: int = DEPTH) -> RemoteOperation:
        """One round trip for the whole burst: the agent (the verbs child) reposts each write itself."""
        return self._op("rdma_write_burst", socket, local_buffers, target_descriptor, offset,
                        count, depth)

    def rdma_read_burst(self, socket: Any, local_buffers: Pairs, source_descriptor: bytes, offset: int = 0,
                        count: int = 1, depth: int = DEPTH) -> RemoteOperation:
        return self._op("rdma_read_burst", socket, local_buffers, source_descriptor, offset,
                        count, depth)

    def send(self, socket: Any, buffers: Pairs) -> RemoteOperation:
        return self._op("send", socket, buffers)

    def recv(self, socket: Any, buffers: Pairs) -> RemoteOperation:
        return self._op("recv", socket, buffers)

    def close_socket(self, socket: Any) -> None:
        self._call("close_socket", socket)
        if isinstance(socket, RemoteSocket) and socket.on_close is not None:
            socket.on_close()
            socket.on_close = None  # told once: a later kill of its process has nothing to relay

    def getsockopt(self, socket: Any, option: int) -> int:
        return int(self._call("getsockopt", socket, option))

    def registrations(self, socket: Any) -> list[RemoteRegistration]:
        return [RemoteRegistration(r["kind"], r["address"], r["length"], Access(r["access"]), r["refs"])
                for r in self._call("registrations", socket)]


class RemoteAllocation(Remote):
    _info: list[Any] | None = None

    def _fetch(self) -> list[Any]:
        if self._info is None:
            self._info = self._call("info")
        return self._info

    @property
    def length(self) -> int:
        return int(self._fetch()[0])

    @property
    def physical_runs(self) -> list[tuple[int, int]]:
        return [(int(a), int(n)) for a, n in self._fetch()[1]]


class RemoteDmaAdapter(Remote):
    @property
    def dma32(self) -> bool:
        return bool(self._call("dma32"))

    def allocate_common_buffer(self, length: int, cache_enabled: bool) -> tuple[int, int] | None:
        got = self._call("allocate_common_buffer", length, cache_enabled)
        return None if got is None else (int(got[0]), int(got[1]))

    def free_common_buffer(self, length: int, logical: int, virtual: int, cache_enabled: bool) -> None:
        self._call("free_common_buffer", length, logical, virtual, cache_enabled)


class RemoteProxy(Remote):
    @property
    def device_flags(self) -> int:
        return int(self._call("device_flags"))

    @property
    def nolowmem(self) -> bool:
        return bool(self._call("nolowmem"))

    @nolowmem.setter
    def nolowmem(self, value: bool) -> None:
        self._call("set_nolowmem", value)

    def allocate(self, nbytes: int) -> RemoteAllocation:
        allocation: RemoteAllocation = self.session.obj(self._call("allocate", nbytes), RemoteAllocation)
        return allocation

    def free(self, allocation: Any) -> None:
        self._call("free", allocation)

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: CacheType) -> int | None:
        got = self._call("allocate_contiguous", nbytes, lowest, highest, boundary, cache_type)
        return None if got is None else int(got)

    def free_contiguous(self, base: int, nbytes: int, cache_type: CacheType) -> None:
        self._call("free_contiguous", base, nbytes, cache_type)

    def get_dma_adapter(self, description: DeviceDescription) -> RemoteDmaAdapter:
        adapter: RemoteDmaAdapter = self.session.obj(self._call("get_dma_adapter", description),
                                                     RemoteDmaAdapter)
        return adapter

    def put_dma_adapter(self, adapter: Any) -> None:
        self._call("put_dma_adapter", adapter)

    def live_allocations(self) -> int:
        return int(self._call("live_allocations"))
