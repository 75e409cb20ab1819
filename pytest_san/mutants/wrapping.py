"""What every entry of the corpus is built from: a provider and a proxy that forward each call of the
``Provider``/``Proxy`` protocols to the ones they wrap, so that an entry changes only the calls its bug is in.

They use nothing but the protocols: the same entry runs on the emulator and on lab hosts (there it wraps the
controller's stand-ins). What one node's wrapper must know of another's (the descriptors a peer issued, the
handles of the node) lives in a ``Shared`` kept per pytest session.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import pytest

from ..spi.contract import PAGE_SIZE, Access, CacheType, Completion, DeviceDescription, SanError
from ..spi.protocols import (
    Buffer,
    CacheTypeProxy,
    Descriptor,
    DirectIoProxy,
    Handle,
    LocalBuffers,
    Node,
    PendingOperation,
    PinnedBytesProxy,
    Process,
    Provider,
    Proxy,
    Socket,
)


@dataclasses.dataclass
class Registered:
    """A registration as a wrapper saw it made: on which socket, of what, how."""

    socket: Socket
    buffer: Buffer
    access: Access
    kind: str  # "memory" or "rdma"
    key: object  # the handle or descriptor the caller got
    count: int = 1  # times the caller got this key and has not deregistered it


@dataclasses.dataclass
class Shared:
    """What the wrappers of one session know together (one wrapper per node)."""

    registered: dict[tuple[int, object], Registered] = dataclasses.field(default_factory=dict)
    """(id(socket), handle or descriptor) -> the live registration (keys are the caller's)."""
    sockets: dict[int, Socket] = dataclasses.field(default_factory=dict)
    """id(socket) -> socket, for every socket a registration named (keeps the ids unique)."""
    extra: dict[object, Any] = dataclasses.field(default_factory=dict)
    """An entry's own tables."""

    def note(self, socket: Socket, buffer: Buffer, access: Access, kind: str, key: object) -> Registered:
        self.sockets[id(socket)] = socket
        found = self.registered.get((id(socket), key))
        if found is not None:
            found.count += 1
            return found
        reg = self.registered[id(socket), key] = Registered(socket, buffer, access, kind, key)
        return reg

    def forget(self, socket: Socket, key: object) -> Registered | None:
        """One deregistration of ``key``; the registration once its count reaches zero, else None."""
        reg = self.registered.get((id(socket), key))
        if reg is None:
            return None
        reg.count -= 1
        if reg.count <= 0:
            del self.registered[id(socket), key]
            return reg
        return None

    def of_socket(self, socket: Socket) -> list[Registered]:
        return [reg for (sid, _), reg in self.registered.items() if sid == id(socket)]

    def drop_socket(self, socket: Socket) -> None:
        for key in [k for k in self.registered if k[0] == id(socket)]:
            del self.registered[key]

    def find(self, key: object, kind: str) -> Registered | None:
        """The live registration whose caller's key is ``key``, on any socket."""
        return next((reg for (_, k), reg in self.registered.items() if k == key and reg.kind == kind), None)


_SHARED = pytest.StashKey[Shared]()


def shared(config: pytest.Config) -> Shared:
    return config.stash.setdefault(_SHARED, Shared())


class Wrapper:
    """What the provider and the proxy wrappers share: the wrapped object, the node, what the session's wrappers
    know; anything the protocol's methods below do not name is forwarded by ``__getattr__``."""

    def __init__(self, inner: Any, node: Node, shared: Shared) -> None:
        self.inner = inner
        self.node = node
        self.shared = shared

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} over {self.inner!r}>"


class DelegatingProvider(Wrapper):
    """Forwards every call of the ``Provider`` protocol to ``inner`` and keeps ``shared`` up to date.

    The protocol's calls are methods of this class, so a subclass overrides exactly those its bug is in and
    bursts (``pytest_san.spi.burst``) are made of this object's own ``rdma_write``/``rdma_read``. Anything else
    (``san_capabilities``, optional protocols) is forwarded by ``__getattr__``.
    """

    inner: Provider

    @property
    def supports_rdma_read(self) -> bool:
        return self.inner.supports_rdma_read

    def register_memory(self, socket: Socket, buffer: Buffer, access: Access) -> Handle:
        handle = self.inner.register_memory(socket, buffer, access)
        self.shared.note(socket, buffer, access, "memory", handle)
        return handle

    def deregister_memory(self, socket: Socket, handle: Handle) -> None:
        self.inner.deregister_memory(socket, handle)
        self.shared.forget(socket, handle)

    def register_rdma_memory(self, socket: Socket, buffer: Buffer, access: Access,
                             descriptor_size: int | None = None) -> Descriptor:
        descriptor = self.inner.register_rdma_memory(socket, buffer, access, descriptor_size)
        self.shared.note(socket, buffer, access, "rdma", bytes(descriptor))
        return descriptor

    def deregister_rdma_memory(self, socket: Socket, descriptor: Descriptor) -> None:
        self.inner.deregister_rdma_memory(socket, descriptor)
        if isinstance(descriptor, bytes | bytearray):
            self.shared.forget(socket, bytes(descriptor))

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        return self.inner.rdma_write(socket, local_buffers, target_descriptor, offset)

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        return self.inner.rdma_read(socket, local_buffers, source_descriptor, offset)

    def send(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        return self.inner.send(socket, buffers)

    def recv(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        return self.inner.recv(socket, buffers)

    def close_socket(self, socket: Socket) -> None:
        self.inner.close_socket(socket)
        self.shared.drop_socket(socket)

    def getsockopt(self, socket: Socket, option: int) -> int:
        return self.inner.getsockopt(socket, option)

    def registrations(self, socket: Socket) -> Sequence[Any]:
        return self.inner.registrations(socket)


class SubstitutingHandles(DelegatingProvider):
    """A provider that may take another handle for each (buffer, handle) entry of a scatter list before the
    wrapped provider sees it (``substitute``); malformed entries pass unchanged, for it to judge."""

    def substitute(self, socket: Socket, buffer: Buffer, handle: Handle) -> Handle:
        raise NotImplementedError

    def register_quietly(self, socket: Socket, buffer: Buffer, access: Access) -> Handle | None:
        """A registration made behind the caller's back (released when the socket closes), or None if refused."""
        try:
            return self.inner.register_memory(socket, buffer, access)
        except SanError:
            return None

    def _local(self, socket: Socket, buffers: Any) -> Any:
        if not isinstance(buffers, list | tuple):
            return buffers
        return [(pair[0], self.substitute(socket, pair[0], pair[1]))
                if isinstance(pair, tuple | list) and len(pair) == 2 else pair for pair in buffers]

    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        return super().rdma_write(socket, self._local(socket, local_buffers), target_descriptor, offset)

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        return super().rdma_read(socket, self._local(socket, local_buffers), source_descriptor, offset)

    def send(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        return super().send(socket, self._local(socket, buffers))

    def recv(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        return super().recv(socket, self._local(socket, buffers))


class DelegatingProxy(Wrapper):
    """Forwards every call of the ``Proxy`` protocol to ``inner``; see ``DelegatingProvider``."""

    inner: Proxy

    @property
    def device_flags(self) -> int:
        return self.inner.device_flags

    @property
    def nolowmem(self) -> bool:
        return self.inner.nolowmem

    def set_nolowmem(self, enabled: bool) -> None:
        self.inner.set_nolowmem(enabled)

    def allocate(self, nbytes: int) -> Any:
        return self.inner.allocate(nbytes)

    def free(self, allocation: Any) -> None:
        self.inner.free(allocation)

    def allocate_contiguous(self, nbytes: int, lowest: int, highest: int, boundary: int,
                            cache_type: CacheType) -> int | None:
        return self.inner.allocate_contiguous(nbytes, lowest, highest, boundary, cache_type)

    def free_contiguous(self, base: int, nbytes: int, cache_type: CacheType) -> None:
        self.inner.free_contiguous(base, nbytes, cache_type)

    def get_dma_adapter(self, description: DeviceDescription) -> Any:
        return self.inner.get_dma_adapter(description)

    def put_dma_adapter(self, adapter: Any) -> None:
        self.inner.put_dma_adapter(adapter)

    def live_allocations(self) -> int:
        return self.inner.live_allocations()

    # DirectIoProxy, CacheTypeProxy and PinnedBytesProxy (capabilities "direct_io", "cache_types", "pinned_bytes"):
    # forwarded as they are; a node whose proxy lacks them lacks the capability (pytest_san.plugin.capabilities).
    def pin(self, buffer: Buffer) -> Any:
        return cast(DirectIoProxy, self.inner).pin(buffer)

    def physical_runs(self, buffer: Buffer) -> Any:
        return cast(DirectIoProxy, self.inner).physical_runs(buffer)

    def compact_memory(self) -> None:
        cast(DirectIoProxy, self.inner).compact_memory()

    def cache_type_of(self, base: int) -> CacheType:
        return cast(CacheTypeProxy, self.inner).cache_type_of(base)

    def pinned_bytes(self) -> int:
        return cast(PinnedBytesProxy, self.inner).pinned_bytes()


class Finished:
    """An operation a wrapper completed itself: done at once."""

    def __init__(self, completion: Completion) -> None:
        self.completion = completion

    def done(self) -> bool:
        return True

    def wait(self, timeout: float | None = 10.0) -> Completion:
        return self.completion


class Recoded:
    """An operation whose completion ``change`` rewrites (an entry that reports statuses wrong)."""

    def __init__(self, inner: PendingOperation, change: Callable[[Completion], Completion]) -> None:
        self.inner = inner
        self.change = change

    def done(self) -> bool:
        return self.inner.done()

    def wait(self, timeout: float | None = 10.0) -> Completion:
        return self.change(self.inner.wait(timeout))


def entries(local_buffers: object) -> Iterator[tuple[Buffer, Handle]]:
    """The (buffer, handle) pairs of a well-formed scatter list, nothing for anything else (the wrapped
    provider judges malformed ones)."""
    if not isinstance(local_buffers, list | tuple):
        return
    for pair in local_buffers:
        if isinstance(pair, tuple | list) and len(pair) == 2:
            yield pair[0], pair[1]


def inside(buffer: object, reg: Registered) -> bool:
    """Whether ``buffer`` lies wholly inside the registration (an integer range, same process)."""
    found = _fields(buffer)
    if found is None:
        return False
    address, length, process = found
    if type(address) is not int or type(length) is not int or length < 0:
        return False
    base, size = reg.buffer.address, reg.buffer.length
    return process is reg.buffer.process and base <= address and address + length <= base + size


def is_access(value: object, flag: Access) -> bool:
    """``value`` is the access flag ``flag`` itself (an ``Access`` or a plain int; not True, not 1.0)."""
    return type(value) in (int, Access) and value == flag


def _fields(buffer: object) -> tuple[object, object, object] | None:
    """A buffer's address, length and process as it answers them, or None when it lacks one."""
    duck: Any = buffer  # any object: duck typed
    try:
        return duck.address, duck.length, duck.process
    except AttributeError:
        return None


def _range(buffer: object) -> tuple[int, int, Process] | None:
    found = _fields(buffer)
    if found is None:
        return None
    address, length, process = found
    if type(address) is not int or type(length) is not int or length <= 0:
        return None
    return address, length, cast(Process, process)


def widened(buffer: Buffer, before: int, after: int) -> Buffer:
    """The range ``before`` bytes earlier to ``after`` bytes later than ``buffer`` (in its process), or
    ``buffer`` itself when it is no plain range (the wrapped provider judges that)."""
    found = _range(buffer)
    if found is None:
        return buffer
    address, length, process = found
    return process.buffer_at(address - before, length + before + after)


def page_rounded(buffer: Buffer) -> tuple[Buffer, int]:
    """(the whole pages ``buffer`` touches, where it starts in them), or (``buffer``, 0) for no plain range."""
    found = _range(buffer)
    if found is None:
        return buffer, 0
    address, length, _ = found
    start = address & ~(PAGE_SIZE - 1)
    end = (address + length + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1)
    return widened(buffer, address - start, end - address - length), address - start


def gather(local_buffers: LocalBuffers) -> bytes:
    return b"".join(buffer.read() for buffer, _ in local_buffers)


def scatter(local_buffers: LocalBuffers, data: bytes) -> None:
    at = 0
    for buffer, _ in local_buffers:
        buffer.write(data[at:at + buffer.length])
        at += buffer.length


def provider_hook(cls: Callable[[Provider, Node, Shared], object]) -> Callable[..., object]:
    """The ``pytest_san_make_provider`` of an entry: ``cls`` wraps every node's provider."""

    def pytest_san_make_provider(config: pytest.Config, node: Node, provider: Provider) -> object:
        return cls(provider, node, shared(config))

    return pytest_san_make_provider


def proxy_hook(cls: Callable[[Proxy, Node, Shared], object]) -> Callable[..., object]:
    """The ``pytest_san_make_proxy`` of an entry: ``cls`` wraps every node's proxy."""

    def pytest_san_make_proxy(config: pytest.Config, node: Node, proxy: Proxy) -> object:
        return cls(proxy, node, shared(config))

    return pytest_san_make_proxy


_fake_keys = itertools.count(0x7A000000)


def fake_handle() -> int:
    """A handle number no provider of the suite hands out."""
    return next(_fake_keys)


__all__ = [
    "DelegatingProvider",
    "DelegatingProxy",
    "Finished",
    "Recoded",
    "Registered",
    "Shared",
    "SubstitutingHandles",
    "entries",
    "fake_handle",
    "gather",
    "inside",
    "is_access",
    "page_rounded",
    "provider_hook",
    "proxy_hook",
    "scatter",
    "shared",
    "widened",
]
