"""The ``verbs`` engine: one node per host, each modelled process a real OS process on the NIC.

The agent dispatches to these objects exactly as to the emulator's: a node, its provider and proxy,
processes, sockets, operations. Provider calls go to the child process that owns the socket (its own
verbs context and PD), so the NIC, not bookkeeping here, keeps processes apart (R1). Python 3.9+,
standard library + pyverbs (in the children).
"""

from __future__ import annotations

import os
from typing import Any

from hil.agent.engines.verbs.children import ChildProcess
from hil.agent.engines.verbs.devices import device_address, select_device
from hil.agent.engines.verbs.kernel_proxy import KernelProxy
from hil.agent.engines.verbs.pin_witness import PinWitness, vm_pin_pages
from hil.agent.engines.verbs.proxy import PinnedProxy, host_capabilities
from hil.agent.engines.verbs.quirks import applied, driver_of
from hil.agent.engines.verbs.witness import KernelWitness
from hil.agent.kmsg import KernelLogWatch
from hil.agent.nvme.available import nvme_fabric_child, nvme_rdma_available
from hil.agent.observe.driver import PROGRAMS, ObservedChild, rsockets_library
from pytest_san.spi import checks
from pytest_san.spi.contract import (
    PAGE_SIZE,
    SanError,
    Status,
    WsaError,
)

RECYCLE_BYTES = 64 << 20  # a default process that handed out more is replaced at the next reset


class VerbsBuffer:
    """A range of a child's memory, named by address (the child checks it is mapped)."""

    __slots__ = ("address", "length", "process")

    def __init__(self, process: ModelledProcess, address: int, length: int) -> None:
        self.process = process
        self.address = address
        self.length = length


class ModelledProcess:
    """A modelled process as the agent holds it: the child OS process that runs its provider side
    (``process.VerbsProcess``), and the sockets it opened."""

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
    """A socket of a modelled process, named by its id in the child; ``peer``: the other end, when on this host."""

    def __init__(self, process: ModelledProcess, sid: int) -> None:
        self.process = process
        self.sid = sid
        self.peer: VerbsSocket | None = None  # set when both ends live on this host
        self.closed = False

    def state(self) -> list[bool]:
        if self.closed or not self.process.alive:
            return [False, True]
        state = self.process.child.call("socket_state", socket=self.sid)
        return [state == "connected", state == "closed"]


def _connectable(process: ModelledProcess) -> None:
    """A killed process connects nowhere: WSAENOTCONN, as the emulator answers (its child is gone: asking it
    would raise the agent's own ChildGone)."""
    if not process.alive:
        raise SanError(WsaError.WSAENOTCONN, f"cannot connect: process {process.pid} is gone")


def _socket_state(sock: VerbsSocket) -> list[bool]:
    return sock.state()


class VerbsOperation:
    """A pending operation of a modelled process, named by its id in the child; its result once waited for."""

    def __init__(self, process: ModelledProcess, op_id: int) -> None:
        self.process = process
        self.op_id = op_id
        self._result: dict[str, Any] | None = None

    @property
    def pending(self) -> bool:
        """Not known to be complete (the child may know better)."""
        return self._result is None and self.process.alive

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


class VerbsProvider:
    """The SAN provider: each call runs in the child owning the socket."""

    def __init__(self, engine: VerbsEngine) -> None:
        self.engine = engine

    @property
    def supports_rdma_read(self) -> bool:
        return True

    def _socket(self, socket: Any) -> VerbsSocket:
        found = socket if isinstance(socket, VerbsSocket) and not socket.closed and socket.process.alive else None
        return checks.socket(found, socket, "this host")

    def register_memory(self, socket: Any, buffer: Any, access: int) -> int:
        sock = self._socket(socket)
        address, length = checks.registration_objects(buffer, sock.process)
        handle: int = sock.process.child.call("register_memory", socket=sock.sid, address=address, length=length,
                                              access=access)
        return handle

    def deregister_memory(self, socket: Any, handle: int) -> None:
        sock = self._socket(socket)
        sock.process.child.call("deregister_memory", socket=sock.sid, handle=handle)

    def register_rdma_memory(self, socket: Any, buffer: Any, access: int, descriptor_size: int | None = None) -> bytes:
        sock = self._socket(socket)
        address, length = checks.registration_objects(buffer, sock.process)
        desc: bytes = sock.process.child.call("register_rdma_memory", socket=sock.sid, address=address, length=length,
                                              access=access, descriptor_size=descriptor_size)
        return desc

    def deregister_rdma_memory(self, socket: Any, descriptor: bytes) -> None:
        sock = self._socket(socket)
        sock.process.child.call("deregister_rdma_memory", socket=sock.sid, descriptor=descriptor)

    def _op(self, socket: Any, method: str, buffers: Any, **params: Any) -> VerbsOperation:
        """The objects stage of pytest_san.spi.checks here, where the buffers are objects; the child, which owns the
        socket and the device, runs the rest."""
        sock = self._socket(socket)
        entries = checks.transfer_objects(method, buffers, sock.process)
        op_id = sock.process.child.call(method, socket=sock.sid, buffers=[list(e) for e in entries], **params)
        return VerbsOperation(sock.process, op_id)

    def rdma_write(self, socket: Any, local_buffers: list[Any], target_descriptor: bytes,
                   offset: int = 0) -> VerbsOperation:
        return self._op(socket, "rdma_write", local_buffers, descriptor=target_descriptor, offset=offset)

    def rdma_read(self, socket: Any, local_buffers: list[Any], source_descriptor: bytes,
                  offset: int = 0) -> VerbsOperation:
        return self._op(socket, "rdma_read", local_buffers, descriptor=source_descriptor, offset=offset)

    def rdma_write_burst(self, socket: Any, local_buffers: list[Any], target_descriptor: bytes, offset: int = 0,
                         count: int = 1, depth: int = 16) -> VerbsOperation:
        # The child reposts each write as the previous completes: no round trip each.
        checks.burst(count, depth)
        return self._op(socket, "rdma_write_burst", local_buffers,
                        descriptor=target_descriptor, offset=offset, count=count, depth=depth)

    def rdma_read_burst(self, socket: Any, local_buffers: list[Any], source_descriptor: bytes, offset: int = 0,
                        count: int = 1, depth: int = 16) -> VerbsOperation:
        checks.burst(count, depth)
        return self._op(socket, "rdma_read_burst", local_buffers,
                        descriptor=source_descriptor, offset=offset, count=count, depth=depth)

    def send(self, socket: Any, buffers: list[Any]) -> VerbsOperation:
        return self._op(socket, "send", buffers)

    def recv(self, socket: Any, buffers: list[Any]) -> VerbsOperation:
        return self._op(socket, "recv", buffers)

    def close_socket(self, socket: Any) -> None:
        sock = self._socket(socket)
        sock.process.child.call("close_socket", socket=sock.sid)
        sock.closed = True
        self.engine.relay_closed(sock)

    def getsockopt(self, socket: Any, option: int) -> int:
        sock = self._socket(socket)
        value: int = sock.process.child.call("getsockopt", socket=sock.sid, option=option)
        return value

    def registrations(self, socket: Any) -> list[dict[str, Any]]:
        if not isinstance(socket, VerbsSocket):
            raise SanError(WsaError.WSAENOTSOCK, f"{socket!r:.80} is not a socket of this host")
        if socket.closed or not socket.process.alive:
            return []  # a closed socket holds nothing (the emulator answers the same)
        regs: list[dict[str, Any]] = socket.process.child.call("registrations", socket=socket.sid)
        return regs


class VerbsProxy:
    """The proxy: ``inner`` (the kernel module's where the host has it, else the userspace stand-in), plus the
    pages the NIC pinned for registrations (R12).

    On Linux ibv_reg_mr pins the registered pages in the kernel; each live registration is counted
    as one pinned allocation, so the balance of R12 is what the host really holds.
    """

    def __init__(self, engine: VerbsEngine, inner: KernelProxy | PinnedProxy) -> None:
        self.engine = engine
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def live_allocations(self) -> int:
        registered = sum(len(self.engine.provider.registrations(s)) for s in self.engine.open_sockets())
        return int(self.inner.live_allocations()) + registered

    def pinned_bytes(self) -> int:
        """PinnedBytesProxy: what the kernel says this node's processes hold pinned (VmPin: every MR's pages, the
        proxy module's pins), plus the bytes of the proxy's own allocations."""
        pages = sum(vm_pin_pages(p.pid) or 0 for p in self.engine.processes if p.alive)
        return pages * PAGE_SIZE + self.inner.allocated_bytes()


def host_proxy(host: str) -> KernelProxy | PinnedProxy:
    """The kernel module's proxy where /dev/san_proxy opens, else the userspace stand-in, told why."""
    try:
        return KernelProxy(host)
    except (OSError, SanError) as exc:  # no module loaded, or it answers no INFO
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return PinnedProxy(host, why=f"no kernel proxy: {why}")


class VerbsNode:
    """The host as a node: its default process and the processes spawned on it."""

    def __init__(self, engine: VerbsEngine, name: str) -> None:
        self.engine = engine
        self.name = name

    @property
    def default_process(self) -> ModelledProcess:
        return self.engine.default_process

    def spawn_process(self) -> ModelledProcess:
        return self.engine.spawn()

    def spawn_observed(self, program: str) -> ObservedChild:
        """A process under observation running ``program``: ``"rsockets"`` (``hil.agent.rsockets``), ``"nvme"``
        or ``"nvme-rogue"`` (``hil.agent.nvme``)."""
        return self.engine.spawn_observed(program)


class VerbsEngine:
    """What the agent dispatches to on a verbs host: the node, its provider and proxy, its processes."""

    name = "verbs"

    def __init__(self, host: str, device: str | None = None, gid_index: int | None = None,
                 netdev: str | None = None, port: int | None = None) -> None:
        """``gid_index`` (san_gid_index) is accepted and not used: the connection manager picks each
        connection's GID. ``netdev`` (san_netdev) names the netdev whose address CM binds to, when the
        device's own cannot be found."""
        self.host = host
        self.device, self.port = select_device(device, port=port)
        self.netdev, self.address = device_address(self.device, self.port, netdev)
        self.processes: list[ModelledProcess] = []
        self._spare: ChildProcess | None = None  # started, not yet a process (never a leak: it holds nothing)
        self.kernel_log = KernelLogWatch()  # an oops, BUG or panic since the agent started ends the run
        self.witness = KernelWitness(self.device)  # the kernel's record of what our processes hold
        self.pin_witness = PinWitness()  # and its books of pinned pages (R12)
        self._exited: list[int] = []  # pids of processes that ended: the kernel must hold nothing of theirs
        self._leaked = False
        self.node = VerbsNode(self, host)
        self.provider = VerbsProvider(self)
        self.proxy = VerbsProxy(self, host_proxy(host))
        self.default_process = self.spawn(spare=False)  # a spare only once processes are spawned: a quick hello
        self.faults = None
        self.observed: list[ObservedChild] = []  # processes under observation (killed at reset and close)

    def spawn_observed(self, program: str) -> ObservedChild:
        if program not in PROGRAMS:
            raise ValueError(f"no program {program!r} to observe on {self.host} (there is: "
                             f"{', '.join(sorted(PROGRAMS))})")
        if program == "nvme":
            child = nvme_fabric_child(self.device, self.address)
        else:
            child = ObservedChild(self.device, self.address, program=program)
        self.observed.append(child)
        return child

    def _end_observed(self) -> None:
        for child in self.observed:
            child.kill()
        self.observed = []

    def spawn(self, *, spare: bool = True) -> ModelledProcess:
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
        process = ModelledProcess(self, child)
        self.processes.append(process)
        if spare:
            self._spare = ChildProcess(self.device, self.port, self.address, wait=False)
        return process

    def open_sockets(self) -> list[VerbsSocket]:
        return [s for p in self.processes if p.alive for s in p.sockets if not s.closed]

    def hello(self) -> dict[str, Any]:
        # reference_order: its checks are pytest_san.spi.checks', in their order (the agent's and the child's stages).
        caps = set(host_capabilities(self.proxy.inner, self.default_process.child.hello)) | {"process_kill",
                                                                                            checks.REFERENCE_ORDER}
        if rsockets_library() is not None:
            caps.add("rsockets")  # librdmacm's rsocket calls, for a switch under observation
        if nvme_rdma_available() is None:
            caps.add("nvme_rdma")  # the kernel's NVMe-oF host and target, and nvme-cli
        return {"engine": self.name, "capabilities": sorted(caps),
                "nodes": [{"name": self.host, "node": self.node, "provider": self.provider, "proxy": self.proxy}],
                "device": self.device, "port": self.port, "address": self.address, "netdev": self.netdev,
                "kernel_witness": self.witness.describe(),
                "proxy": self.proxy.inner.describe(),  # the report names which proxy ran here
                "kernel_log": self.kernel_log.unavailable or "watched",
                # the kernel workarounds its processes apply here (they decide alike: same kernel, same device)
                "workarounds": [w.name for w in applied(driver_of(self.device))]}

    # -- connections -------------------------------------------------------------------------------

    def socket_listen(self, process: ModelledProcess) -> list[Any]:
        """[a socket of ``process`` listening for its peer, {"address", "port"} for the peer's
        ``socket_connect``]: the child accepts the connect request by itself."""
        _connectable(process)
        sid, where = process.child.socket_listen()
        sock = VerbsSocket(process, sid)
        process.sockets.append(sock)
        return [sock, where]

    def socket_connect(self, process: ModelledProcess, where: dict[str, Any]) -> VerbsSocket:
        """A socket of ``process`` connected to the listener at ``where``, once the connection is up."""
        _connectable(process)
        sock = VerbsSocket(process, process.child.socket_connect(where))
        process.sockets.append(sock)
        return sock

    def connect_local(self, a: ModelledProcess, b: ModelledProcess) -> list[VerbsSocket]:
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
        """What the books say is still registered or allocated, then what the kernel says our processes
        still hold beyond what they declare (read now), and what earlier readings found since the last
        leak check: a leak as the kernel saw it."""
        found = [[self.host, "registration", text] for p in self.processes if p.alive
                 for text in p.child.call("leaks")]
        found += [[self.host, "allocation", text] for text in self.proxy.inner.leaks()]
        trouble = self.kernel_log.trouble()
        if trouble:
            found.append([self.host, "oops", "\n".join(trouble)])
        self.kernel_reading("with the leak check")
        unreported = self.witness.unreported()
        found += [[self.host, "kernel", f"{r['at']}: {text}"] for r in unreported for text in r["findings"]]
        found += [[self.host, "pin", f"{r['at']}: {text}"] for r in unreported for text in r.get("pin_findings", ())]
        self._leaked = bool(found)
        return found

    # -- the kernel's record (witness.py) ----------------------------------------------------------

    def _declared(self) -> list[dict[str, Any]]:
        """What each of our processes says it holds (its sockets' registrations as its provider reports
        them, the engine's own MRs, QPs, PDs, CM ids, its context and CQ); the agent and every process
        that ended hold nothing. A spare child not yet handed out is left out (it may be opening its
        device this moment)."""
        out: list[dict[str, Any]] = [{"pid": os.getpid(), "role": "agent"}]
        for process in self.processes:
            role = "default" if process is self.default_process else "spawned"
            if process.alive:
                declared = process.child.call("kernel_declared")
                declared["vm_pin_pages"] = declared.get("vm_pin_pages", 0) + self.proxy.inner.pinned_pages(process.pid)
                out.append({**declared, "role": role})
            else:
                out.append({"pid": process.pid, "role": f"{role}, killed"})
        live = {d["pid"] for d in out}  # a pid the guest gave out again is the live process's
        out += [{"pid": pid, "role": "exited"} for pid in dict.fromkeys(self._exited) if pid not in live]
        return out

    def kernel_reading(self, at: str) -> None:
        """Read the kernel's record and its books of pinned pages now, and keep the reading (the end-of-test
        batch collects it)."""
        declared = self._declared()
        self.witness.read(at, declared, pins=self.pin_witness.read(declared, [c.pid for c in self.observed]))

    def kernel_readings(self) -> list[dict[str, Any]]:
        """The readings since the last call (the controller files them under the test that made them)."""
        return self.witness.take()

    def end_session(self) -> dict[str, Any]:
        """Close every process, then read what the kernel still holds of any process this agent ran (every
        one has ended: anything is left over). The engine serves nothing afterwards."""
        self.close()
        declared = self._declared()
        return self.witness.read("at the session's end", declared, every=True, pins=self.pin_witness.read(declared))

    def reset(self) -> None:
        """Spawned processes end (the kernel drops whatever they held); the default one is kept, with
        its sockets closed, unless it died or holds much memory: starting a pyverbs process is slow.
        After a test whose leak check found something, the kernel is read again once the reset is done."""
        self._end_observed()
        default = self.default_process
        keep = default.alive and default.allocated < RECYCLE_BYTES
        for process in self.processes:
            if process is not default or not keep:
                process.child.close()
                self._exited.append(process.pid)
        self.proxy.inner.reset()
        if keep:
            default.child.call("reset")
            default.sockets = []
            self.processes = [default]
        else:
            self.processes = []
            self.default_process = self.spawn()
        if self._leaked:
            self._leaked = False
            self.kernel_reading("after the reset")
        del self._exited[:-64]  # judged at least once after they ended: a long session keeps the last ones

    def close(self) -> None:
        self._end_observed()
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()
            self._exited.append(spare.pid)
        for process in self.processes:
            process.child.close()
            self._exited.append(process.pid)
        self.processes = []
        self.proxy.inner.close()
        self.kernel_log.close()

    def pinned(self) -> list[Any]:
        return [self, self.node, self.provider, self.proxy]

    def prefetch(self, kind: str, method: str, target: Any, args: list[Any]) -> bool:
        """Write ahead the child requests of a read-only request (``hil.agent.dispatch``: requests that arrived
        together); whether it is one. Each takes effect only if the request, made in its turn, asks the same."""
        asks: list[tuple[ModelledProcess, str, dict[str, object]]] = []
        if (kind, method) == ("socket", "state") and isinstance(target, VerbsSocket) and not target.closed:
            asks.append((target.process, "socket_state", {"socket": target.sid}))
        elif (kind, method) == ("provider", "registrations") and args and isinstance(args[0], VerbsSocket):
            asks.append((args[0].process, "registrations", {"socket": args[0].sid}))
        elif (kind, method) == ("proxy", "live_allocations"):
            asks += [(s.process, "registrations", {"socket": s.sid}) for s in self.open_sockets()]
        elif (kind, method) == ("process", "buffer_read") and isinstance(target, ModelledProcess) and len(args) == 4 \
                and all(type(a) is int for a in args):
            address, _, n, offset = args
            asks.append((target, "read", {"address": address + offset, "length": n}))
        elif kind == "operation" and isinstance(target, VerbsOperation) and target.pending:
            if method == "done":
                asks.append((target.process, "op_done", {"op_id": target.op_id}))
            elif method == "wait" and args == [0]:
                asks.append((target.process, "op_wait", {"op_id": target.op_id, "timeout": 0}))
        else:
            return False
        for process, child_method, params in asks:
            if process.alive:
                process.child.prefetch(child_method, params)
        return True

    def forget_prefetched(self) -> None:
        for process in self.processes:
            process.child.forget_prefetched()

    @staticmethod
    def resolve_buffer(process: ModelledProcess, address: int, length: int) -> VerbsBuffer:
        return VerbsBuffer(process, address, length)

    @staticmethod
    def kind_of(obj: Any) -> str:
        return _KINDS.get(type(obj).__name__, type(obj).__name__)


_KINDS = {"VerbsEngine": "engine", "VerbsNode": "node", "ModelledProcess": "process", "VerbsProvider": "provider",
          "VerbsProxy": "proxy", "VerbsSocket": "socket", "VerbsOperation": "operation",
          "HostAllocation": "allocation", "HostDmaAdapter": "adapter", "ObservedChild": "observed",
          "KernelAllocation": "allocation", "KernelPin": "allocation", "KernelDmaAdapter": "adapter"}
