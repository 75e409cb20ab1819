"""The ``verbs`` engine: one node per host, each modelled process a real OS process on the NIC.

The agent dispatches to these objects exactly as to the emulator's: a node, its provider and proxy,
processes, sockets, operations. Provider calls go to the child process that owns the socket (its own
verbs context and PD), so the NIC, not bookkeeping here, keeps processes apart (R1). Python 3.9+,
standard library + pyverbs (in the children).
"""

from __future__ import annotations

from typing import Any

from hil.agent.engines.verbs.children import ChildProcess
from hil.agent.engines.verbs.devices import device_address, select_device
from hil.agent.engines.verbs.proxy import PinnedProxy, host_capabilities
from pytest_san.contract import (
    MAX_SGE,
    SanError,
    Status,
    WsaError,
)

RECYCLE_BYTES = 64 << 20  # a default process that handed out more is replaced at the next reset


class VerbsBuffer:
    """A range of a child's memory, named by address (the child checks it is mapped)."""

    __slots__ = ("address", "length", "process")

    def __init__(self, process: VerbsProcess, address: int, length: int) -> None:
        self.process = process
        self.address = address
        self.length = length


class VerbsProcess:
    def __init__(self, engine: VerbsEngine, child: ChildProcess) -> None:
        self.engine = engine
        self.child = child
        self.pid = self.child.pid
        self.sockets: list[VerbsSocket] = []
        self.allocated = 0  # bytes of buffers handed out (they live as long as the process)

    @property
    def alive(self) -> bool:
        return self.child.alive

    def alloc(self, nbytes: int) -> VerbsBuffer:
        address, length = self.child.alloc(nbytes)
        self.allocated += length
        return VerbsBuffer(self, address, length)

    def read(self, address: int, length: int) -> bytes:
        return self.child.read(address, length)

    def write(self, address: int, data: bytes) -> None:
        self.child.write(address, data)

    def buffer_at(self, address: int, length: int) -> VerbsBuffer:
        return VerbsBuffer(self, address, length)

    def kill(self) -> None:
        """SIGKILL: the kernel releases its QPs, MRs and windows; peers on this host are told."""
        self.child.kill()
        for sock in self.sockets:
            self.engine.relay_closed(sock)
            sock.closed = True


class VerbsSocket:
    def __init__(self, process: VerbsProcess, sid: int) -> None:
        self.process = process
        self.sid = sid
        self.peer: VerbsSocket | None = None  # set when both ends live on this host
        self.closed = False

    def state(self) -> list[bool]:
        if self.closed or not self.process.alive:
            return [False, True]
        state = self.process.child.call("socket_state", socket=self.sid)
        return [state == "connected", state == "closed"]


def _connectable(process: VerbsProcess) -> None:
    """A killed process connects nowhere: WSAENOTCONN, as the emulator answers (the SPI fuzz on siw found
    the child's ChildGone escaping a switch.connect from a process it had killed)."""
    if not process.alive:
        raise SanError(WsaError.WSAENOTCONN, f"cannot connect: process {process.pid} is gone")


def _socket_state(sock: VerbsSocket) -> list[bool]:
    return sock.state()


class VerbsOperation:
    def __init__(self, process: VerbsProcess, op_id: int) -> None:
        self.process = process
        self.op_id = op_id
        self._result: dict[str, Any] | None = None

    def done(self) -> bool:
        if self._result is None and self.process.alive:
            return bool(self.process.child.call("op_done", op_id=self.op_id))
        return True

    def wait(self, timeout: float | None = 10.0) -> dict[str, Any]:
        if self._result is None:
            if not self.process.alive:  # the process died: the kernel flushed it
                return {"status": Status.ABORTED.value, "bytes": 0}
            done = self.process.child.op_wait(self.op_id, timeout)
            self._result = {"status": done["status"], "bytes": done["bytes"], "wc_status": done.get("wc_status")}
        return self._result


def _pairs(sock: VerbsSocket, buffers: list[Any]) -> list[list[int]]:
    """[(buffer, handle)] as the child wants them: [address, length, handle]. Every entry is checked
    before the child sees any, so a malformed list marks nothing in use."""
    if not isinstance(buffers, (list, tuple)):
        raise TypeError(f"local_buffers must be a list of (buffer, handle) pairs, got {buffers!r:.80}")
    if len(buffers) > MAX_SGE:  # the count before any entry, as the emulator does (pytest_san.model, differential)
        raise SanError(WsaError.WSAEINVAL, f"{len(buffers)} buffers, at most {MAX_SGE}")
    for i, pair in enumerate(buffers):  # every entry's shape first: a malformed one is a TypeError, whatever else
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not isinstance(pair[0], VerbsBuffer):
            raise TypeError(f"local_buffers[{i}] is not a (buffer, handle) pair: {pair!r:.80}")
    out = []
    for buffer, handle in buffers:
        if buffer.process is not sock.process:
            # Another process's address means nothing here; the child would read its own memory.
            raise SanError(WsaError.WSAEFAULT,
                           f"buffer of pid {buffer.process.pid} used on a socket of pid {sock.process.pid}")
        out.append([buffer.address, buffer.length, handle])
    return out


class VerbsProvider:
    """The SAN provider: each call runs in the child owning the socket."""

    def __init__(self, engine: VerbsEngine) -> None:
        self.engine = engine

    @property
    def supports_rdma_read(self) -> bool:
        return True

    def _child(self, socket: Any) -> Any:
        if not isinstance(socket, VerbsSocket) or socket.closed or not socket.process.alive:
            raise SanError(WsaError.WSAENOTSOCK, f"{socket!r} is not an open socket of this host")
        return socket.process.child

    def _registration(self, socket: VerbsSocket, buffer: Any) -> None:
        # A buffer whose fields the controller sent as they were (a duck-typed one, dispatch.RawBuffer) is judged
        # as in-process: whose it is first (WSAEFAULT), its fields by the child (the SPI fuzz on siw found one of
        # another host, address None, refused with a TypeError where the emulator answers WSAEFAULT).
        if not all(hasattr(buffer, field) for field in ("address", "length", "process")):
            raise TypeError(f"buffer must be a buffer of a process, got {buffer!r:.80}")
        if buffer.process is not socket.process:
            raise SanError(WsaError.WSAEFAULT, f"{buffer.length!r:.20} bytes at {buffer.address!r:.20} are not in the "
                           f"address space of pid {socket.process.pid}")

    def register_memory(self, socket: Any, buffer: Any, access: int) -> int:
        child = self._child(socket)
        self._registration(socket, buffer)
        handle: int = child.call("register_memory", socket=socket.sid, address=buffer.address,
                                 length=buffer.length, access=access)
        return handle

    def deregister_memory(self, socket: Any, handle: int) -> None:
        self._child(socket).call("deregister_memory", socket=socket.sid, handle=handle)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: int, descriptor_size: int | None = None) -> bytes:
        child = self._child(socket)
        self._registration(socket, buffer)
        desc: bytes = child.call("register_rdma_memory", socket=socket.sid, address=buffer.address,
                                 length=buffer.length, access=access, descriptor_size=descriptor_size)
        return desc

    def deregister_rdma_memory(self, socket: Any, descriptor: bytes) -> None:
        self._child(socket).call("deregister_rdma_memory", socket=socket.sid, descriptor=descriptor)

    def _op(self, socket: Any, method: str, buffers: list[Any], **params: Any) -> VerbsOperation:
        child = self._child(socket)  # checked before _pairs looks at the socket's process
        op_id = child.call(method, socket=socket.sid, buffers=_pairs(socket, buffers), **params)
        return VerbsOperation(socket.process, op_id)

    def rdma_write(self, socket: Any, local_buffers: list[Any], target_descriptor: bytes,
                   offset: int = 0) -> VerbsOperation:
        return self._op(socket, "rdma_write", local_buffers, descriptor=target_descriptor, offset=offset)

    def rdma_read(self, socket: Any, local_buffers: list[Any], source_descriptor: bytes,
                  offset: int = 0) -> VerbsOperation:
        return self._op(socket, "rdma_read", local_buffers, descriptor=source_descriptor, offset=offset)

    def rdma_write_burst(self, socket: Any, local_buffers: list[Any], target_descriptor: bytes, offset: int = 0,
                         count: int = 1, depth: int = 16) -> VerbsOperation:
        # The child reposts each write as the previous completes: no round trip each.
        return self._op(socket, "rdma_write_burst", local_buffers,
                        descriptor=target_descriptor, offset=offset, count=count, depth=depth)

    def rdma_read_burst(self, socket: Any, local_buffers: list[Any], source_descriptor: bytes, offset: int = 0,
                        count: int = 1, depth: int = 16) -> VerbsOperation:
        return self._op(socket, "rdma_read_burst", local_buffers,
                        descriptor=source_descriptor, offset=offset, count=count, depth=depth)

    def send(self, socket: Any, buffers: list[Any]) -> VerbsOperation:
        return self._op(socket, "send", buffers)

    def recv(self, socket: Any, buffers: list[Any]) -> VerbsOperation:
        return self._op(socket, "recv", buffers)

    def close_socket(self, socket: Any) -> None:
        self._child(socket).call("close_socket", socket=socket.sid)
        socket.closed = True
        self.engine.relay_closed(socket)

    def getsockopt(self, socket: Any, option: int) -> int:
        value: int = self._child(socket).call("getsockopt", socket=socket.sid, option=option)
        return value

    def registrations(self, socket: Any) -> list[dict[str, Any]]:
        if not isinstance(socket, VerbsSocket):
            raise SanError(WsaError.WSAENOTSOCK, f"{socket!r:.80} is not a socket of this host")
        if socket.closed or not socket.process.alive:
            return []  # a closed socket holds nothing (the emulator answers the same)
        regs: list[dict[str, Any]] = socket.process.child.call("registrations", socket=socket.sid)
        return regs


class VerbsProxy:
    """The proxy: pinned memory of the host, plus the pages the NIC pinned for registrations (R12).

    On Linux ibv_reg_mr pins the registered pages in the kernel; each live registration is counted
    as one pinned allocation, so the balance of R12 is what the host really holds.
    """

    def __init__(self, engine: VerbsEngine, pinned: PinnedProxy) -> None:
        self.engine = engine
        self.pinned = pinned

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pinned, name)

    def live_allocations(self) -> int:
        registered = sum(len(self.engine.provider.registrations(s)) for s in self.engine.open_sockets())
        return int(self.pinned.live_allocations()) + registered


class VerbsNode:
    def __init__(self, engine: VerbsEngine, name: str) -> None:
        self.engine = engine
        self.name = name

    @property
    def default_process(self) -> VerbsProcess:
        return self.engine.default_process

    def spawn_process(self) -> VerbsProcess:
        return self.engine.spawn()


class VerbsEngine:
    name = "verbs"

    def __init__(self, host: str, device: str | None = None, gid_index: int | None = None,
                 netdev: str | None = None, port: int | None = None) -> None:
        """``gid_index`` (san_gid_index) is accepted and not used: the connection manager picks each
        connection's GID. ``netdev`` (san_netdev) names the netdev whose address CM binds to, when the
        device's own cannot be found."""
        self.host = host
        self.device, self.port = select_device(device, port=port)
        self.netdev, self.address = device_address(self.device, self.port, netdev)
        self.processes: list[VerbsProcess] = []
        self._spare: ChildProcess | None = None  # started, not yet a process (never a leak: it holds nothing)
        self.node = VerbsNode(self, host)
        self.provider = VerbsProvider(self)
        self.proxy = VerbsProxy(self, PinnedProxy(host))
        self.default_process = self.spawn(spare=False)  # a spare only once processes are spawned: a quick hello
        self.faults = None

    def spawn(self, *, spare: bool = True) -> VerbsProcess:
        """A new process: the spare child started after the last spawn when it came up, else a fresh one;
        then (``spare``) the next spare starts (a pyverbs child takes seconds to start on a slow host, the
        spare starts while the test goes on)."""
        ready, self._spare = self._spare, None
        child = None
        if ready is not None:
            try:
                child = ready.ready()
            except Exception:  # whatever kept it from starting then, a fresh child meets it or not now
                ready.kill()
        if child is None:
            child = ChildProcess(self.device, self.port, self.address)
        process = VerbsProcess(self, child)
        self.processes.append(process)
        if spare:
            self._spare = ChildProcess(self.device, self.port, self.address, wait=False)
        return process

    def open_sockets(self) -> list[VerbsSocket]:
        return [s for p in self.processes if p.alive for s in p.sockets if not s.closed]

    def hello(self) -> dict[str, Any]:
        caps = set(host_capabilities(self.proxy.pinned, self.default_process.child.hello)) | {"process_kill"}
        return {"engine": self.name, "capabilities": sorted(caps),
                "nodes": [{"name": self.host, "node": self.node, "provider": self.provider, "proxy": self.proxy}],
                "device": self.device, "port": self.port, "address": self.address, "netdev": self.netdev}

    # -- connections -------------------------------------------------------------------------------

    def socket_listen(self, process: VerbsProcess) -> list[Any]:
        """[a socket of ``process`` listening for its peer, {"address", "port"} for the peer's
        ``socket_connect``]: the child accepts the connect request by itself."""
        _connectable(process)
        sid, where = process.child.socket_listen()
        sock = VerbsSocket(process, sid)
        process.sockets.append(sock)
        return [sock, where]

    def socket_connect(self, process: VerbsProcess, where: dict[str, Any]) -> VerbsSocket:
        """A socket of ``process`` connected to the listener at ``where``, once the connection is up."""
        _connectable(process)
        sock = VerbsSocket(process, process.child.socket_connect(where))
        process.sockets.append(sock)
        return sock

    def connect_local(self, a: VerbsProcess, b: VerbsProcess) -> list[VerbsSocket]:
        sb, where = self.socket_listen(b)
        try:
            sa = self.socket_connect(a, where)
        except BaseException:
            self.provider.close_socket(sb)
            raise
        sa.peer, sb.peer = sb, sa
        return [sa, sb]

    socket_state = staticmethod(_socket_state)

    def peer_closed(self, socket: VerbsSocket) -> None:
        """The controller relays that the other end (on another host) closed or died: CM's DISCONNECTED
        tells the child too, this is the fallback for a host that vanished (and a no-op after it)."""
        if not socket.closed and socket.process.alive:
            socket.process.child.call("socket_peer_closed", socket=socket.sid)

    def relay_closed(self, socket: VerbsSocket) -> None:
        # CM's DISCONNECTED reaches the surviving end too, but only once it looks: told now, its state
        # is the peer's close at once.
        if socket.peer is not None:
            self.peer_closed(socket.peer)

    # -- books ---------------------------------------------------------------------------------------

    def leaks(self) -> list[list[str]]:
        found = [[self.host, "registration", text] for p in self.processes if p.alive
                 for text in p.child.call("leaks")]
        return found + [[self.host, "allocation", text] for text in self.proxy.pinned.leaks()]

    def reset(self) -> None:
        """Spawned processes end (the kernel drops whatever they held); the default one is kept, with
        its sockets closed, unless it died or holds much memory: starting a pyverbs process is slow."""
        default = self.default_process
        keep = default.alive and default.allocated < RECYCLE_BYTES
        for process in self.processes:
            if process is not default or not keep:
                process.child.close()
        self.proxy.pinned.reset()
        if keep:
            default.child.call("reset")
            default.sockets = []
            self.processes = [default]
        else:
            self.processes = []
            self.default_process = self.spawn()

    def close(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()
        for process in self.processes:
            process.child.close()
        self.processes = []
        self.proxy.pinned.reset()

    def pinned(self) -> list[Any]:
        return [self, self.node, self.provider, self.proxy]

    @staticmethod
    def resolve_buffer(process: VerbsProcess, address: int, length: int) -> VerbsBuffer:
        return VerbsBuffer(process, address, length)

    @staticmethod
    def kind_of(obj: Any) -> str:
        return _KINDS.get(type(obj).__name__, type(obj).__name__)


_KINDS = {"VerbsEngine": "engine", "VerbsNode": "node", "VerbsProcess": "process", "VerbsProvider": "provider",
          "VerbsProxy": "proxy", "VerbsSocket": "socket", "VerbsOperation": "operation",
          "HostAllocation": "allocation", "HostDmaAdapter": "adapter"}
