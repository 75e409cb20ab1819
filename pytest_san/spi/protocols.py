"""Typed protocols every backend implements: what the switch, fixtures and scenarios may rely on.

Layering (labgrid-style): a *backend* owns *nodes* (hosts); a node has a *provider*, a *proxy* and
*processes*; a process owns *buffers* in its own address space and *sockets*. Scenarios and the
switch talk only to these protocols, so the same suite runs on the emulator and on lab hosts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .contract import Access, CacheType, Completion, DeviceDescription, Leak

Handle = Hashable
"""A register_memory handle: an opaque value of the provider's choosing (an int, a string, ...), hashable and
compared by equality, never assumed to be an int; valid only in the registering process, on that socket."""

Descriptor = bytes
"""An RDMA descriptor: opaque bytes, of the length the provider chose (the ``descriptor_size`` probe tells it),
that the peer uses as RDMA target or source."""


@runtime_checkable
class Buffer(Protocol):
    """A range of a process's virtual memory (real bytes)."""

    @property
    def process(self) -> Process: ...
    @property
    def address(self) -> int: ...
    @property
    def length(self) -> int: ...
    def read(self, n: int | None = None, offset: int = 0) -> bytes: ...
    def write(self, data: bytes, offset: int = 0) -> None: ...
    def view(self, offset: int, length: int) -> Buffer:
        """The sub-range [offset, offset+length) of this buffer."""
        ...


LocalBuffers = Sequence[tuple[Buffer, Handle]]
"""[WSABUFEX]: (buffer range, handle) pairs."""


class PendingOperation(Protocol):
    """An overlapped operation; ``wait`` yields its completion or raises TimeoutError."""

    def done(self) -> bool: ...
    def wait(self, timeout: float | None = 10.0) -> Completion: ...


class Socket(Protocol):
    """A SAN socket owned by one process."""

    @property
    def process(self) -> Process: ...
    @property
    def connected(self) -> bool: ...
    @property
    def closed(self) -> bool: ...


class Registration(Protocol):
    """What a provider reports about one live registration (for checks, not for use)."""

    @property
    def kind(self) -> str:
        """``"memory"`` (register_memory) or ``"rdma"`` (register_rdma_memory)."""
        ...
    @property
    def address(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def access(self) -> Access: ...
    @property
    def refs(self) -> int: ...


class Provider(Protocol):
    """The SAN service provider's SPI extensions (CONTRACT.md section 2); it enforces R1-R14."""

    @property
    def supports_rdma_read(self) -> bool: ...

    def register_memory(self, socket: Socket, buffer: Buffer, access: Access) -> Handle: ...
    def deregister_memory(self, socket: Socket, handle: Handle) -> None: ...
    def register_rdma_memory(self, socket: Socket, buffer: Buffer, access: Access,
                             descriptor_size: int | None = None) -> Descriptor: ...
    def deregister_rdma_memory(self, socket: Socket, descriptor: Descriptor) -> None: ...
    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation: ...
    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation: ...
    def send(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation: ...
    def recv(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation: ...
    def close_socket(self, socket: Socket) -> None: ...
    def getsockopt(self, socket: Socket, option: int) -> int:
        """SO_MAX_RDMA_SIZE or SO_RDMA_THRESHOLD_SIZE."""
        ...
    def registrations(self, socket: Socket) -> Sequence[Registration]:
        """Live registrations on ``socket`` (introspection for R9-R13 checks)."""
        ...


class Allocation(Protocol):
    """Physical memory the proxy allocated or pinned."""

    @property
    def length(self) -> int: ...
    @property
    def physical_runs(self) -> Sequence[tuple[int, int]]:
        """(physical address, bytes) runs, in order."""
        ...


class DmaAdapter(Protocol):
    """The adapter IoGetDmaAdapter returns; its DMA_OPERATIONS as methods."""

    @property
    def dma32(self) -> bool: ...
    def allocate_common_buffer(self, length: int, cache_enabled: bool) -> tuple[int, int] | None:
        """(virtual address, logical address) of a physically contiguous buffer, or None."""
        ...
    def free_common_buffer(self, length: int, logical: int, virtual: int, cache_enabled: bool) -> None: ...


class Proxy(Protocol):
    """The provider's kernel-mode proxy driver (P1-P5)."""

    @property
    def device_flags(self) -> int: ...
    @property
    def nolowmem(self) -> bool: ...
    def set_nolowmem(self, enabled: bool) -> None:
        """Enter or leave NOLOWMEM mode (capability ``"nolowmem"``; a proxy without the mode raises
        SanError(WSAEOPNOTSUPP)). A call, not an attribute, so a wrapping proxy forwards it like any other."""
        ...

    def allocate(self, nbytes: int) -> Allocation:
        """Allocate (pin) memory for messages or RDMA; raises SanError(WSAENOBUFS) when out."""
        ...
    def free(self, allocation: Allocation) -> None: ...
    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: CacheType) -> int | None:
        """Base physical address of a contiguous block, or None when impossible."""
        ...
    def free_contiguous(self, base: int, nbytes: int, cache_type: CacheType) -> None: ...
    def get_dma_adapter(self, description: DeviceDescription) -> DmaAdapter: ...
    def put_dma_adapter(self, adapter: DmaAdapter) -> None: ...
    def live_allocations(self) -> int:
        """Allocations (of any kind) not yet freed."""
        ...


class DirectIoProxy(Protocol):
    """Optional, for a proxy (capability ``"direct_io"``): DO_DIRECT_IO's access to user buffers (P1), where the
    proxy can show it. The I/O manager locks a requester's own pages for a direct-I/O driver (an MDL), so that the
    switch and the NIC move data through them, never through a copy.

    ``pin(buffer)`` locks the pages of ``buffer`` in its own process where they are, until ``free(allocation)``;
    the Allocation's ``physical_runs`` are the frames locked, covering exactly the buffer's bytes (the first
    run starts at the buffer's offset in its page). ``physical_runs(buffer)`` says where the buffer's bytes are
    now, as its process's page tables map them (Linux: /proc/PID/pagemap). ``compact_memory()`` asks the host
    to move every page it may move now (Linux: vm.compact_memory), so that a pin can be told from a page that
    merely has not moved yet."""

    def pin(self, buffer: Buffer) -> Allocation: ...
    def physical_runs(self, buffer: Buffer) -> Sequence[tuple[int, int]]: ...
    def compact_memory(self) -> None: ...


class CacheTypeProxy(Protocol):
    """Optional, for a proxy (capability ``"cache_types"``): ``cache_type_of(base)`` is the cache type the live
    contiguous block at physical ``base`` is really mapped with, read back from the page table where the
    platform has one (P4), not what the proxy remembers it was asked."""

    def cache_type_of(self, base: int) -> CacheType: ...


class PinnedBytesProxy(Protocol):
    """Optional, for a proxy (capability ``"pinned_bytes"``): ``pinned_bytes()`` is how many bytes of memory its
    node holds pinned now for registrations and the proxy's allocations, as the platform itself counts them where
    it does (Linux: the ``VmPin`` of the node's processes, pages the kernel pinned for every MR), else as the proxy
    keeps its books. A registration of a buffer holds pinned at least every byte from the start of its first page
    to its last byte until it ends (R8, R12): ``pinned_bytes`` shows a pin shorter than what it covers, where
    ``live_allocations`` counts only pins."""

    def pinned_bytes(self) -> int: ...


@runtime_checkable
class Process(Protocol):
    """A process on a node, with its own virtual address space."""

    @property
    def node(self) -> Node: ...
    @property
    def pid(self) -> int: ...
    @property
    def alive(self) -> bool: ...
    def alloc(self, nbytes: int) -> Buffer: ...
    def buffer_at(self, address: int, length: int) -> Buffer:
        """A buffer naming any range, mapped or not (to probe WSAEFAULT)."""
        ...
    def kill(self) -> None: ...


@runtime_checkable
class Node(Protocol):
    """A host on the SAN."""

    @property
    def name(self) -> str: ...
    @property
    def provider(self) -> Provider: ...
    @property
    def proxy(self) -> Proxy: ...
    @property
    def default_process(self) -> Process: ...
    def spawn_process(self) -> Process: ...


@runtime_checkable
class DeclaresCapabilities(Protocol):
    """Optional, for a provider or proxy: what it lacks or adds beyond what pytest-san reads from it
    (``supports_rdma_read`` gives ``rdma_read``): each name mapped to True is added to its node's capabilities,
    each mapped to False removed, e.g. ``{"contiguous": False, "dma_adapter": False}`` for a proxy on a
    platform without contiguous allocation or DMA adapters (their scenarios are then skipped, with the
    reason). The hook ``pytest_san_node_capabilities`` has the last word."""

    @property
    def san_capabilities(self) -> Mapping[str, bool]: ...


class Faults(Protocol):
    """Fault injection (capability ``"faults"``)."""

    def fail_allocations(self, node: Node, count: int, after: int = 0) -> None:
        """The next ``count`` proxy allocations on ``node`` fail with WSAENOBUFS, once ``after`` more have
        succeeded (0: from the next one on). A new call replaces what is left of the last one."""
        ...
    def drop_link(self, a: Node, b: Node) -> None: ...
    def restore_link(self, a: Node, b: Node) -> None: ...
    def hold(self, socket: Socket) -> None:
        """Operations posted on ``socket`` stay pending until ``release``."""
        ...
    def release(self, socket: Socket) -> None: ...


class Backend(Protocol):
    """What the fixtures hand out as ``san_backend``."""

    @property
    def name(self) -> str: ...
    @property
    def capabilities(self) -> frozenset[str]: ...
    @property
    def nodes(self) -> Sequence[Node]: ...
    @property
    def faults(self) -> Faults | None: ...

    def connect_sockets(self, a: Process, b: Process) -> tuple[Socket, Socket]:
        """Create and connect a socket in ``a`` and one in ``b`` (QP exchange on verbs)."""
        ...
    def leaks(self) -> list[Leak]:
        """Registrations and proxy allocations still alive on every node."""
        ...
    def reset(self) -> None:
        """After every test: forcibly release whatever is left, restore links and faults, end the
        processes the test spawned; the next test starts on a clean SAN."""
        ...
    def close(self) -> None: ...


@runtime_checkable
class EndsTests(Protocol):
    """Optional, for a backend whose every call is a round trip (hil): ``end_test(close)`` ends a test in one
    step, in as few round trips as it can: ``close()`` (the switches closing what the test left; None: nothing
    to close), the leak check and the reset. Returns (the leaks, the errors of ``close`` and of each call it
    made on its behalf). The leak check uses it where a backend has it, else ``leaks()`` then ``reset()``."""

    def end_test(self, close: Callable[[], None] | None = None) -> tuple[list[Leak], list[Exception]]: ...


@runtime_checkable
class CountsRoundTrips(Protocol):
    """Optional, for a backend whose calls are round trips (hil): ``round_trips()`` says, per host, how many
    times it has waited for answers so far. The fixtures record what each test's SAN fixtures cost in them
    (the ``san_round_trips`` user property)."""

    def round_trips(self) -> Mapping[str, int]: ...


@dataclasses.dataclass(frozen=True)
class ModelBudget:
    """How much of the reference model a run does, and how it spends it on its backend; the defaults, written
    here only, are ``pytest --pyargs pytest_san.model``'s on the in-process emulator.

    How much: ``sequences`` random SPI sequences of ``steps`` steps, starting none after ``deadline`` seconds
    (None: no deadline), drawn from ``seed`` (None: a fresh one, printed), in ``differential`` mode or not.
    How: ``full_checks`` checks everything after every step (else only what the step could change, and
    everything once a sequence ends); a completion is waited for ``call_timeout`` seconds; shrinking a
    divergence replays its steps at most ``shrink_replays`` times; ``avoid_slow_steps`` steers away from the
    few steps that cost seconds where calls cross a network to a NIC (pytest_san/model/generate.py)."""

    sequences: int = 100
    steps: int = 40
    deadline: float | None = None
    seed: int | None = None
    differential: bool = False
    full_checks: bool = True
    call_timeout: float = 2.0
    shrink_replays: int = 200
    avoid_slow_steps: bool = False


@runtime_checkable
class DeclaresModelBudget(Protocol):
    """Optional, for a backend: the budget of the reference model that ``pytest --pyargs pytest_san.scenarios``
    runs on it by default (the options override it; ``pytest --pyargs pytest_san.model`` takes its settings at
    the defaults' size). A backend whose every call is a round trip declares a small one, with fewer checks and
    longer waits; one without it gets ``ModelBudget()`` (docs/model.md)."""

    def model_budget(self) -> ModelBudget: ...


def budget_of(backend: object) -> ModelBudget:
    """What ``backend`` declares (``DeclaresModelBudget``), else ``ModelBudget()``; a TypeError when it declares
    something else."""
    if not isinstance(backend, DeclaresModelBudget):
        return ModelBudget()
    budget = backend.model_budget()
    if not isinstance(budget, ModelBudget):
        raise TypeError(f"{type(backend).__name__}.model_budget() must return a pytest_san.spi.protocols.ModelBudget, "
                        f"got {budget!r:.120}")
    return budget


@runtime_checkable
class SwitchEndpoint(Protocol):
    """One end of a connection a switch made (CONTRACT.md section 5): its socket, process, provider and proxy,
    and the application's calls on it, which the switch turns into provider calls."""

    @property
    def name(self) -> str:
        """``"local"`` or ``"remote"``: how ``SwitchConnection.trace`` names this end."""
        ...
    @property
    def socket(self) -> Socket: ...
    @property
    def process(self) -> Process: ...
    @property
    def provider(self) -> Provider: ...
    @property
    def proxy(self) -> Proxy: ...
    @property
    def peer(self) -> SwitchEndpoint: ...
    def send(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` for the peer (inline messages, or RDMA above the connection's ``rdma_threshold``)."""
        ...
    def recv(self, nbytes: int, timeout: float = 10.0) -> bytes:
        """Exactly ``nbytes`` of the peer's data, in order, driving both ends until they are there; TimeoutError
        after ``timeout`` seconds; SanError (WSAECONNRESET, WSAENOTCONN) once the connection failed."""
        ...
    def progress(self) -> bool:
        """Move this end alone as far as it can now (reap completions, handle messages, send what flow control
        allows); whether anything moved. A closed end moves nothing (False, or SanError WSAENOTSOCK)."""
        ...
    def close(self) -> None:
        """R11: deregister every region no pending operation uses, then close the socket; a second call does
        nothing."""
        ...


@runtime_checkable
class SwitchConnection(Protocol):
    """A connected socket pair a switch made (``Switch.connect``), with the switch's parameters as it uses them.

    ``rdma_threshold``, ``message_size`` and ``message_count`` are what the connection uses: the threshold
    ``connect`` asked for, else the switch's own; the ring as asked, or the switch's own (it may round it, or have
    a fixed one). The scenarios judge the switch by these."""

    @property
    def local(self) -> SwitchEndpoint: ...
    @property
    def remote(self) -> SwitchEndpoint: ...
    @property
    def trace(self) -> Sequence[tuple[str, str]]:
        """Every provider call the switch made on this connection's sockets, in order: (endpoint name, method),
        e.g. ``("local", "register_memory")``, ``("remote", "rdma_read")``, ``("local", "close_socket")``."""
        ...
    @property
    def rdma_threshold(self) -> int:
        """R10: application sends longer than this many bytes move by RDMA, the others in messages."""
        ...
    @property
    def message_size(self) -> int:
        """Bytes of one message slot (each region holds ``message_count`` of them)."""
        ...
    @property
    def message_count(self) -> int:
        """Message slots per region: the ring of posted receives (and of sends in flight)."""
        ...
    def progress(self) -> bool:
        """Both ends, until neither moves; whether anything moved."""
        ...
    def run_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Drive both ends until ``condition()``; TimeoutError naming ``what`` after ``timeout`` seconds."""
        ...
    def flush(self, timeout: float = 10.0) -> None:
        """Until every queued message and large transfer of both ends has finished."""
        ...
    def close(self) -> None:
        """Close both ends (``SwitchEndpoint.close``)."""
        ...


@runtime_checkable
class Switch(Protocol):
    """The Windows Sockets switch under test (``san_switch``; a plugin's ``pytest_san_make_switch`` may give its
    own): it connects SAN sockets, registers their message memory (R9), moves data (R10) and tears down (R11).

    ``connect`` options (each may be left out): ``rdma_threshold`` (bytes; None or left out: the switch's own,
    pytest-san's asks the provider's SO_RDMA_THRESHOLD_SIZE), ``rdma_mode`` (``"auto"``: RdmaRead unless the
    receiving end lacks it, ``"read"``, ``"write"``), ``message_size`` and ``message_count``. A threshold and a
    mode asked for are the ones used; the ring (``message_size``, ``message_count``) a switch may choose itself,
    and says so on the connection. An unknown option or an unusable value is a TypeError or ValueError naming
    it, before anything is built; a connect that fails later releases all it built before it raises."""

    def connect(self, peer: Node | Process | None = None, process: Node | Process | None = None,
                **options: Any) -> SwitchConnection:
        """A connected socket pair between ``process`` (default: the first node's default process) and ``peer``
        (default: the second node's, or the first's when there is one node)."""
        ...
    def close_all(self) -> None:
        """Close every connection this switch made (both ends); safe to call twice. A socket already gone
        (WSAENOTSOCK) is no failure; anything else is one SanError naming each."""
        ...
