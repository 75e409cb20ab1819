"""Controller-side stand-ins for the objects an agent holds; each follows a pytest_san protocol
(checked by mypy at the end of this module)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from hil.controller.client import AgentClient, Outcome
from hil.controller.declared import SCRIPT, Request, declared, local, remote, remote_void
from hil.rpc.codec import Codec, buffer_fields, buffer_ref, object_ref, referenced
from pytest_san.spi.burst import DEPTH, BurstProvider
from pytest_san.spi.contract import Access, CacheType, Completion, DeviceDescription, Status, is_int
from pytest_san.spi.protocols import (
    Allocation,
    Buffer,
    CacheTypeProxy,
    Descriptor,
    DirectIoProxy,
    DmaAdapter,
    Handle,
    LocalBuffers,
    Node,
    PendingOperation,
    PinnedBytesProxy,
    Process,
    Provider,
    Proxy,
    Registration,
    Socket,
)

if TYPE_CHECKING:
    from hil.rpc.codec import Encoded
    from pytest_san.batch import Batch


def as_handle(value: object) -> Handle:
    """A register_memory handle as the agent sent it: opaque, whatever JSON carried (an int, a string, ...), never
    made an int; an array becomes a tuple, to stay hashable."""
    return tuple(value) if isinstance(value, list) else value


class Remote:
    """An object living in an agent, known by its id there."""

    def __init__(self, session: Session, oid: int) -> None:
        self.session = session
        self.oid = oid

    def _call(self, method: str, *args: object, timeout: float | None = None) -> Any:
        """The agent's answer: decoded JSON, arbitrary until the caller reads it as what it asked for."""
        return self.session.call(self.oid, method, *args, timeout=timeout)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.oid} on {self.session.client.host.name}>"


class StandInCodec(Codec):
    """The controller's side of the codec: its stand-ins for one agent's objects as references; another
    agent's object, or one of this process, as an object that agent knows nothing of."""

    description = DeviceDescription

    def __init__(self, session: Session) -> None:
        self.session = session

    def own(self, value: object) -> Encoded:
        fields = _buffer_like(value)
        if fields is not None:
            process, address, length = fields[0], self.encode(fields[1]), self.encode(fields[2])
            if process.session is self.session:
                return buffer_ref(process.oid, address, length)
            # Another host's memory: a buffer of a process the engine does not know (WSAEFAULT there).
            return buffer_ref(process.session.client.host.name, address, length, foreign=True)
        if isinstance(value, Remote) and value.session is self.session:
            return object_ref(value.oid)
        return None


def _buffer_like(value: object) -> tuple[RemoteProcess, object, object] | None:
    """(process, address, length) of a RemoteBuffer, or of any object with ``.address``, ``.length`` and a
    remote ``.process`` (providers take such duck-typed buffers in-process too, judging each field)."""
    if isinstance(value, RemoteBuffer):
        return value.process, value.address, value.length
    try:
        process, address, length = value.process, value.address, value.length  # type: ignore[attr-defined]  # any object: duck typed
    except Exception:  # not buffer-like: an object the agent knows nothing of
        return None
    return (process, address, length) if isinstance(process, RemoteProcess) else None


Ref = Mapping[str, Any]
"""A reference as the agent answers it, ``{"$o": id, "type": kind}`` or ``{"$buf": [...]}`` (decoded JSON)."""

R = TypeVar("R", bound="Remote")


class Session:
    """One agent's objects: wraps the references it returns, encodes what we send (``hil.rpc.codec``).

    The engine, not the controller, judges every argument, in its own order, so that bad input gets the
    error it gets in-process (CONTRACT.md section 4): each argument is sent as itself where JSON carries it
    faithfully, else as a stand-in that is equally not what the engine expects.
    """

    def __init__(self, client: AgentClient) -> None:
        self.client = client
        self.codec = StandInCodec(self)
        self._objects: dict[int, Remote] = {}
        self.pinned: set[int] = set()
        # A peer's close relayed from another host (connecting.relay): it goes out ahead of the next request
        # to this agent, nobody waiting for its answer; its error is kept for the end of the test to report.
        self._relays: list[tuple[int, str, tuple[object, ...]]] = []
        self.deferred_errors: list[tuple[str, Exception]] = []
        self._sent: list[str | None] = []  # what was written since the last collect: a relay's method, or None
        # The end of a test (HilBackend.end_test): the batch that takes the calls whose answer nobody reads
        # (@remote_void), and the answers a batch asked ahead for what closing reads. Test code never sees either.
        self.deferred: Batch | None = None
        self.ahead: dict[tuple[int, str], tuple[tuple[object, ...], Outcome]] | None = None

    def call(self, oid: int, method: str, *args: object, timeout: float | None = None) -> Any:
        """The agent's answer (decoded JSON: arbitrary until the stand-in's method reads it); made together with
        other calls while a declared body runs in a batch (hil/controller/declared.py)."""
        script = SCRIPT.get()
        if script is not None:
            return script.ask(Request(self, oid, method, args, timeout))
        answered = None if self.ahead is None else self.ahead.get((oid, method))
        if answered is not None and answered[0] == args:
            ok, value = answered[1]
            if not ok:
                raise value
            return value
        encoded = [self.codec.encode(a) for a in args]
        if not self._relays and not self._sent:
            return self.client.call(oid, method, *encoded, timeout=timeout)
        self.send_one(oid, method, encoded)
        [(ok, value)] = self.collect(timeout)
        if not ok:
            raise value
        return value

    def heard(self, request: Request, outcome: Outcome) -> None:
        """A batch's reply: kept as an answer while the end of a test asks ahead (``ahead``)."""
        if self.ahead is not None:
            self.ahead[request.oid, request.method] = (request.args, outcome)

    def relay(self, oid: int, method: str, *args: object) -> None:
        """A call whose answer nobody waits for: it goes out with the next request to this agent, ahead of it
        (its error, if any, kept in ``deferred_errors``). A relay naming a stand-in this session has forgotten
        by then (a reset dropped the peer's socket) is not sent: what it would tell is gone with the object."""
        self._relays.append((oid, method, args))

    def send_one(self, obj: Encoded, method: str, args: list[Encoded]) -> int:
        """Write one request (after the relays) without waiting: its request id (``collect`` reads it)."""
        self._send_relays()
        rid = self.client.send(obj, method, args)
        self._sent.append(None)
        return rid

    def send_many(self, requests: list[tuple[int, str, list[Encoded]]]) -> None:
        """Write the relays and ``requests`` without waiting (``collect`` reads the replies): the harness asks
        several agents at once."""
        for oid, method, args in requests:
            self.send_one(oid, method, args)

    def _send_relays(self) -> None:
        relays, self._relays = self._relays, []
        for oid, method, args in relays:
            if all(self._objects.get(a.oid) is a for a in args if isinstance(a, Remote)):
                self.client.send(oid, method, [self.codec.encode(a) for a in args])
                self._sent.append(method)

    def collect(self, timeout: float | None = None) -> list[Outcome]:
        """The outcomes of what was written (``send_one``, ``send_many``), the relays' errors to
        ``deferred_errors``."""
        sent, self._sent = self._sent, []
        outcomes = self.client.collect(timeout)
        mine: list[Outcome] = []
        for relayed, (ok, value) in zip(sent, outcomes, strict=True):
            if relayed is None:
                mine.append((ok, value))
            elif not ok:
                self.deferred_errors.append((relayed, value))
        return mine

    def obj(self, ref: Ref, factory: Callable[..., R], *extra: object) -> R:
        oid = referenced(ref)
        found = self._objects.get(oid)
        if found is None:
            found = factory(self, oid, *extra)
            self._objects[oid] = found
        return cast(R, found)  # an id names one object, made by the one factory of its kind

    def objects(self) -> list[Remote]:
        """Every stand-in this session knows (until a reset forgets the unpinned ones)."""
        return list(self._objects.values())

    def sockets_of(self, process: RemoteProcess) -> list[RemoteSocket]:
        """The sockets of ``process`` this session knows (until a reset forgets them)."""
        return [o for o in self._objects.values() if isinstance(o, RemoteSocket) and o.process is process]

    def forget_unpinned(self) -> None:
        self._objects = {k: v for k, v in self._objects.items() if k in self.pinned}
        for node in self._objects.values():
            if isinstance(node, RemoteNode):
                node.forget_default()

    def buffer(self, ref: Ref) -> RemoteBuffer:
        oid, address, length = buffer_fields(ref)
        process = self._objects[oid]
        assert isinstance(process, RemoteProcess)
        return RemoteBuffer(process, address, length)


def _int(value: object, what: str) -> int:
    """``value`` if it is an integer (an int subclass as its int, never a bool); else a TypeError naming
    ``what`` (as the emulator's process and buffer methods check it)."""
    if is_int(value):
        return int(value)
    raise TypeError(f"{what} must be an integer, got {value!r:.80}")


@declared
class RemoteNode(Remote):
    def __init__(self, session: Session, oid: int, name: str, provider: Ref, proxy: Ref) -> None:
        super().__init__(session, oid)
        self._name = name
        # The stand-ins, or what the plugin's provider and proxy hooks wrapped them in (backend.Agent).
        self.own_provider = session.obj(provider, RemoteProvider)
        self.provider: Provider = self.own_provider
        self.proxy: Proxy = session.obj(proxy, RemoteProxy)
        self._default: RemoteProcess | None = None

    @property
    @local
    def name(self) -> str:
        return self._name

    @local
    def forget_default(self) -> None:
        """A reset may replace the default process: ask again next time."""
        self._default = None

    @property
    @remote
    def default_process(self) -> RemoteProcess:
        # The same process until the next reset on every engine (even killed: the emulator's and the verbs
        # engine's node keep it until a reset), so it is asked for once per reset.
        if self._default is None:
            self._default = self.session.obj(self._call("default_process"), RemoteProcess, self)
        return self._default

    @remote
    def default_after_reset(self) -> RemoteProcess:
        """The default process a reset made: asked in the reset's own write (``HilBackend.reset``)."""
        self._default = self.session.obj(self._call("default_process"), RemoteProcess, self)
        return self._default

    @remote
    def spawn_process(self) -> RemoteProcess:
        return self.session.obj(self._call("spawn_process"), RemoteProcess, self)


@declared
class RemoteProcess(Remote):
    def __init__(self, session: Session, oid: int, node: RemoteNode) -> None:
        super().__init__(session, oid)
        self._node = node

    @property
    @local
    def node(self) -> RemoteNode:
        return self._node

    @property
    @local
    def pid(self) -> int:
        return self.oid

    @property
    @remote
    def alive(self) -> bool:
        return bool(self._call("alive"))

    @remote
    def alloc(self, nbytes: int) -> RemoteBuffer:
        return self.session.buffer(self._call("alloc", nbytes))

    @local
    def buffer_at(self, address: int, length: int) -> RemoteBuffer:
        """Any range, mapped or not, even of a negative length (providers refuse those)."""
        return RemoteBuffer(self, _int(address, "address"), _int(length, "length"))

    @remote
    def kill(self) -> None:
        self._call("kill")
        # Its agent tells peers on the same host; peers on other hosts learn it from us, as for a close.
        for sock in self.session.sockets_of(self):
            if sock.on_close is not None:
                sock.on_close()
                sock.on_close = None


@declared
@dataclasses.dataclass(frozen=True)
class RemoteBuffer:
    """A range of a remote process's memory; reads and writes go to the agent, which checks the whole buffer,
    as a buffer of its engine is checked (mapped, process alive)."""

    process: RemoteProcess
    address: int
    length: int

    @property
    @local
    def session(self) -> Session:
        return self.process.session

    @remote
    def read(self, n: int | None = None, offset: int = 0) -> bytes:
        n, offset = self.checked_read(n, offset)
        data: bytes = self.process._call("buffer_read", self.address, self.length, n, offset)
        return data

    @local
    def checked_read(self, n: object = None, offset: object = 0) -> tuple[int, int]:
        """(n, offset) of a read inside the buffer; TypeError or ValueError otherwise."""
        offset = _int(offset, "offset")
        n = self.length - offset if n is None else _int(n, "n")
        if offset < 0 or n < 0 or offset + n > self.length:
            raise ValueError(f"read of {n} bytes at offset {offset} is outside a {self.length}-byte buffer")
        return n, offset

    @remote
    def write(self, data: bytes | bytearray | memoryview, offset: int = 0) -> None:
        payload, offset = self.checked_write(data, offset)
        self.process._call("buffer_write", self.address, self.length, payload, offset)

    @local
    def checked_write(self, data: object, offset: object = 0) -> tuple[bytes, int]:
        """(the bytes, offset) of a write inside the buffer; TypeError or ValueError otherwise."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"write takes bytes, got {data!r:.80}")
        offset = _int(offset, "offset")
        payload = bytes(data)
        if offset < 0 or offset + len(payload) > self.length:
            raise ValueError(f"write of {len(payload)} bytes at offset {offset} "
                             f"is outside a {self.length}-byte buffer")
        return payload, offset

    @local
    def view(self, offset: int, length: int) -> RemoteBuffer:
        offset, length = _int(offset, "offset"), _int(length, "length")
        if offset < 0 or length < 0 or offset + length > self.length:
            raise ValueError(f"view [{offset}, {offset + length}) is outside a {self.length}-byte buffer")
        return RemoteBuffer(self.process, self.address + offset, length)


@declared
class RemoteSocket(Remote):
    def __init__(self, session: Session, oid: int, process: RemoteProcess) -> None:
        super().__init__(session, oid)
        self._process = process
        self.on_close: Callable[[], None] | None = None  # tells the peer's host, when it is another one

    @property
    @local
    def process(self) -> RemoteProcess:
        return self._process

    @property
    @remote
    def connected(self) -> bool:
        return bool(self._call("state")[0])

    @property
    @remote
    def closed(self) -> bool:
        return bool(self._call("state")[1])


def wait_deadline(timeout: object) -> float | None:
    """How long a wait's reply may take: the agent waits up to ``timeout``, and has room to answer after it. The
    argument is the agent's to judge: one that is no timeout gets the default reply deadline (None)."""
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 <= timeout < 1e9:
        return timeout + 30
    return None


@declared
class RemoteOperation(Remote):
    """A pending operation; once complete, its completion is kept here and never asked for again."""

    _completion: Completion | None = None

    @property
    @local
    def pending(self) -> bool:
        """Not known to be complete here (the agent may know better)."""
        return self._completion is None

    @local
    def completed(self, reply: Mapping[str, Any]) -> Completion:
        """Keep the agent's answer to ``wait``."""
        self._completion = Completion(Status(reply["status"]), reply["bytes"])
        return self._completion

    @remote
    def done(self) -> bool:
        # A wait of no time: a completion is kept for good; one that times out is not done yet.
        if self._completion is None:
            try:
                self.completed(self._call("wait", 0))
            except TimeoutError:
                return False
        return True

    @remote
    def wait(self, timeout: float | None = 10.0) -> Completion:
        if self._completion is None:
            return self.completed(self._call("wait", timeout, timeout=wait_deadline(timeout)))
        return self._completion


@dataclasses.dataclass(frozen=True)
class RemoteRegistration:
    kind: str
    address: int
    length: int
    access: Access
    refs: int


@declared
class RemoteProvider(Remote):
    _rdma_read: bool | None = None

    @property
    @remote
    def supports_rdma_read(self) -> bool:
        if self._rdma_read is None:
            self._rdma_read = bool(self._call("supports_rdma_read"))
        return self._rdma_read

    def _op(self, method: str, *args: object) -> RemoteOperation:
        return self.session.obj(self._call(method, *args), RemoteOperation)

    @remote
    def register_memory(self, socket: Socket, buffer: Buffer, access: Access) -> Handle:
        return as_handle(self._call("register_memory", socket, buffer, access))

    @remote_void
    def deregister_memory(self, socket: Socket, handle: Handle) -> None:
        self._call("deregister_memory", socket, handle)

    @remote
    def register_rdma_memory(self, socket: Socket, buffer: Buffer, access: Access,
                             descriptor_size: int | None = None) -> Descriptor:
        return bytes(self._call("register_rdma_memory", socket, buffer, access, descriptor_size))

    @remote_void
    def deregister_rdma_memory(self, socket: Socket, descriptor: Descriptor) -> None:
        self._call("deregister_rdma_memory", socket, descriptor)

    @remote
    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> RemoteOperation:
        return self._op("rdma_write", socket, local_buffers, target_descriptor, offset)

    @remote
    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> RemoteOperation:
        return self._op("rdma_read", socket, local_buffers, source_descriptor, offset)

    @remote
    def rdma_write_burst(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                         offset: int = 0, count: int = 1, depth: int = DEPTH) -> RemoteOperation:
        """One round trip for the whole burst: the agent (the verbs child) reposts each write itself."""
        return self._op("rdma_write_burst", socket, local_buffers, target_descriptor, offset,
                        count, depth)

    @remote
    def rdma_read_burst(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                        offset: int = 0, count: int = 1, depth: int = DEPTH) -> RemoteOperation:
        return self._op("rdma_read_burst", socket, local_buffers, source_descriptor, offset,
                        count, depth)

    @remote
    def send(self, socket: Socket, buffers: LocalBuffers) -> RemoteOperation:
        return self._op("send", socket, buffers)

    @remote
    def recv(self, socket: Socket, buffers: LocalBuffers) -> RemoteOperation:
        return self._op("recv", socket, buffers)

    @remote_void
    def close_socket(self, socket: Socket) -> None:
        # The peer's host is told after this host closed (a refused close tells nothing): the relay goes out
        # with that host's next request, so a pending receive there completes as closed here (ABORTED when
        # both ends close in one batch), and a relay its reset made moot is dropped (Session.relay).
        self._call("close_socket", socket)
        self.closed_socket(socket)

    @local
    def closed_socket(self, socket: object) -> None:
        """``socket`` is being closed: its peer's host is told (once: a later kill of its process has nothing to
        relay), with the next request to that host."""
        if isinstance(socket, RemoteSocket) and socket.on_close is not None:
            socket.on_close()
            socket.on_close = None

    @remote
    def getsockopt(self, socket: Socket, option: int) -> int:
        return int(self._call("getsockopt", socket, option))

    @remote
    def registrations(self, socket: Socket) -> list[RemoteRegistration]:
        return as_registrations(self._call("registrations", socket))


def as_registrations(reply: Any) -> list[RemoteRegistration]:
    """The agent's answer to ``registrations`` (decoded JSON) as the stand-in returns it."""
    return [RemoteRegistration(r["kind"], r["address"], r["length"], Access(r["access"]), r["refs"]) for r in reply]


@declared
class RemoteAllocation(Remote):
    _info: list[Any] | None = None

    def _fetch(self) -> list[Any]:
        if self._info is None:
            self._info = self._call("info")
        return self._info

    @property
    @remote
    def length(self) -> int:
        return int(self._fetch()[0])

    @property
    @remote
    def physical_runs(self) -> list[tuple[int, int]]:
        return [(int(a), int(n)) for a, n in self._fetch()[1]]


@declared
class RemoteDmaAdapter(Remote):
    @property
    @remote
    def dma32(self) -> bool:
        return bool(self._call("dma32"))

    @remote
    def allocate_common_buffer(self, length: int, cache_enabled: bool) -> tuple[int, int] | None:
        got = self._call("allocate_common_buffer", length, cache_enabled)
        return None if got is None else (int(got[0]), int(got[1]))

    @remote
    def free_common_buffer(self, length: int, logical: int, virtual: int, cache_enabled: bool) -> None:
        self._call("free_common_buffer", length, logical, virtual, cache_enabled)


@declared
class RemoteProxy(Remote):
    @property
    @remote
    def device_flags(self) -> int:
        return int(self._call("device_flags"))

    @property
    @remote
    def nolowmem(self) -> bool:
        return bool(self._call("nolowmem"))

    @remote
    def set_nolowmem(self, enabled: bool) -> None:
        self._call("set_nolowmem", enabled)

    @remote
    def allocate(self, nbytes: int) -> RemoteAllocation:
        return self.session.obj(self._call("allocate", nbytes), RemoteAllocation)

    @remote
    def free(self, allocation: Allocation) -> None:
        self._call("free", allocation)

    @remote
    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: CacheType) -> int | None:
        got = self._call("allocate_contiguous", nbytes, lowest, highest, boundary, cache_type)
        return None if got is None else int(got)

    @remote
    def free_contiguous(self, base: int, nbytes: int, cache_type: CacheType) -> None:
        self._call("free_contiguous", base, nbytes, cache_type)

    @remote
    def get_dma_adapter(self, description: DeviceDescription) -> RemoteDmaAdapter:
        return self.session.obj(self._call("get_dma_adapter", description), RemoteDmaAdapter)

    @remote
    def put_dma_adapter(self, adapter: DmaAdapter) -> None:
        self._call("put_dma_adapter", adapter)

    @remote
    def live_allocations(self) -> int:
        return int(self._call("live_allocations"))

    @remote
    def pin(self, buffer: Buffer) -> RemoteAllocation:
        return self.session.obj(self._call("pin", buffer), RemoteAllocation)

    @remote
    def physical_runs(self, buffer: Buffer) -> list[tuple[int, int]]:
        return [(int(a), int(n)) for a, n in self._call("physical_runs", buffer)]

    @remote
    def compact_memory(self) -> None:
        self._call("compact_memory")

    @remote
    def cache_type_of(self, base: int) -> CacheType:
        return CacheType(self._call("cache_type_of", base))

    @remote
    def pinned_bytes(self) -> int:
        return int(self._call("pinned_bytes"))


# mypy checks each stand-in against the protocol it stands in for (no runtime cost).
if TYPE_CHECKING:
    def _is_node(n: RemoteNode) -> Node: return n
    def _is_process(p: RemoteProcess) -> Process: return p
    def _is_buffer(b: RemoteBuffer) -> Buffer: return b
    def _is_socket(s: RemoteSocket) -> Socket: return s
    def _is_operation(o: RemoteOperation) -> PendingOperation: return o
    def _is_registration(r: RemoteRegistration) -> Registration: return r
    def _is_provider(p: RemoteProvider) -> Provider: return p
    def _is_burst_provider(p: RemoteProvider) -> BurstProvider: return p
    def _is_allocation(a: RemoteAllocation) -> Allocation: return a
    def _is_adapter(a: RemoteDmaAdapter) -> DmaAdapter: return a
    def _is_proxy(p: RemoteProxy) -> Proxy: return p
    def _is_direct_io(p: RemoteProxy) -> DirectIoProxy: return p
    def _is_cache_type(p: RemoteProxy) -> CacheTypeProxy: return p
    def _is_pinned_bytes(p: RemoteProxy) -> PinnedBytesProxy: return p
