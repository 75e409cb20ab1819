"""Helpers the scenarios share: guarded buffers and "was it rejected?" checks, all on the public API."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pytest

from pytest_san import Access, Buffer, Completion, Process, Provider, Proxy, SanError, Socket, Status, WsaError
from pytest_san.protocols import Outcome as CallOutcome
from pytest_san.together import first_failure, together

GUARD = 64
GUARD_BYTE = 0xA5
TIMEOUT = 30.0  # Soft-RoCE under TCG is slow: be generous, the emulator never waits this long


class End(Protocol):
    """One end of a connection: a switch Endpoint or a RawEnd."""

    @property
    def socket(self) -> Socket: ...
    @property
    def process(self) -> Process: ...
    @property
    def provider(self) -> Provider: ...
    @property
    def proxy(self) -> Proxy: ...


@dataclasses.dataclass
class Guarded:
    """A buffer with guard bytes either side of ``inner``; the guards must never change."""

    whole: Buffer
    inner: Buffer
    fill: int

    def intact(self) -> bool:
        data = self.whole.read()
        n = self.inner.length
        return data[:GUARD] == bytes([GUARD_BYTE]) * GUARD and data[GUARD + n:] == bytes([GUARD_BYTE]) * GUARD

    def unchanged(self) -> bool:
        """Guards intact and the inner bytes still the fill pattern."""
        return self.intact() and self.inner.read() == bytes([self.fill]) * self.inner.length


def guarded(endpoint: End, nbytes: int, fill: int = 0x00) -> Guarded:
    whole = endpoint.process.alloc(nbytes + 2 * GUARD)
    whole.write(bytes([GUARD_BYTE]) * GUARD + bytes([fill]) * nbytes + bytes([GUARD_BYTE]) * GUARD)
    return Guarded(whole, whole.view(GUARD, nbytes), fill)


def source(endpoint: End, data: bytes, access: Access = Access.READ) -> tuple[Buffer, int]:
    """A registered local buffer holding ``data``: a valid RDMA write source or send buffer."""
    buf = endpoint.process.alloc(len(data))
    buf.write(data)
    return buf, endpoint.provider.register_memory(endpoint.socket, buf, access)


def sources(backend: object, endpoint: End, payloads: Sequence[bytes],
            access: Access = Access.READ) -> list[tuple[Buffer, int]]:
    """``source`` of each payload: the allocations, then the writes, then the registrations, each made
    together where ``backend`` can (a lab: three round trips in all); the first failure is raised."""
    bufs = _results(together(backend, [(endpoint.process, "alloc", (len(data),)) for data in payloads]))
    _results(together(backend, [(buf, "write", (data,)) for buf, data in zip(bufs, payloads, strict=True)]))
    handles = _results(together(backend, [(endpoint.provider, "register_memory", (endpoint.socket, buf, access))
                                          for buf in bufs]))
    return list(zip(bufs, handles, strict=True))


def _results(outcomes: Sequence[CallOutcome]) -> list[Any]:
    failure = first_failure(outcomes)
    if failure is not None:
        raise failure
    return [value for _, value in outcomes]


def sink(endpoint: End, nbytes: int, access: Access = Access.WRITE) -> tuple[Guarded, int]:
    """A registered local buffer (with guards) to receive into."""
    g = guarded(endpoint, nbytes, fill=0x11)
    return g, endpoint.provider.register_memory(endpoint.socket, g.inner, access)


def window(endpoint: End, nbytes: int, access: Access, fill: int = 0x22) -> tuple[Guarded, bytes]:
    """A guarded buffer registered for RDMA by ``endpoint``: (guarded buffer, descriptor)."""
    g = guarded(endpoint, nbytes, fill)
    return g, endpoint.provider.register_rdma_memory(endpoint.socket, g.inner, access)


Outcome = Completion | SanError

NEEDS_READ = pytest.mark.san_requires("rdma_read")
"""RdmaRead is optional (CONTRACT.md section 2): a scenario that calls it declares so."""
RDMA_KINDS = ["rdma_write", pytest.param("rdma_read", marks=NEEDS_READ)]
"""Parametrize over both RDMA directions; the read one is skipped on nodes without RdmaRead."""


def expect_error(code: WsaError, call: Callable[..., object], *args: Any) -> SanError:
    """The SanError ``call(*args)`` must raise, with ``code``."""
    with pytest.raises(SanError) as info:
        call(*args)
    assert info.value.code is code, f"expected {code.name}, got {info.value}"
    return info.value


def attempt(call: Callable[[], Any]) -> Outcome:
    """Run a provider call: a SanError, or the completion of the operation it started."""
    try:
        result = call()
    except SanError as exc:
        return exc
    return result.wait(timeout=TIMEOUT)  # type: ignore[no-any-return]


def rejected(outcome: Outcome) -> bool:
    return isinstance(outcome, SanError) or outcome.status is not Status.SUCCESS


def succeeded(outcome: Outcome, nbytes: int) -> bool:
    return isinstance(outcome, Completion) and outcome.status is Status.SUCCESS and outcome.bytes == nbytes


def write_into(initiator: End, descriptor: bytes, data: bytes, offset: int = 0) -> Outcome:
    """RDMA-write ``data`` from a fresh registered source of ``initiator`` into ``descriptor``."""
    buf, handle = source(initiator, data)
    return attempt(lambda: initiator.provider.rdma_write(initiator.socket, [(buf, handle)], descriptor, offset))


def read_from(initiator: End, descriptor: bytes, nbytes: int, offset: int = 0) -> tuple[Outcome, Guarded]:
    """RDMA-read ``nbytes`` from ``descriptor`` into a fresh registered sink of ``initiator``."""
    g, handle = sink(initiator, nbytes)
    return attempt(lambda: initiator.provider.rdma_read(initiator.socket, [(g.inner, handle)], descriptor,
                                                         offset)), g


def receive(sender: End, receiver: End, buffers: list[tuple[Buffer, int]], data: bytes) -> Outcome:
    """A receive into ``buffers`` posted by ``receiver``, and ``data`` sent by ``sender`` only if the receive is
    still pending (a provider may refuse a bad sink at the call, at once, or only when data arrives). The
    receive's outcome; the send's is not looked at (it may fail either way). No other receive may be posted."""
    try:
        recv = receiver.provider.recv(receiver.socket, buffers)
    except SanError as exc:
        return exc
    if not recv.done():
        try:  # the receive may have failed by now, and broken the connection: the send may be refused
            buf, handle = source(sender, data)
            attempt(lambda: sender.provider.send(sender.socket, [(buf, handle)]))
        except SanError:
            pass
    return recv.wait(timeout=TIMEOUT)


@dataclasses.dataclass
class RawEnd:
    """One end of a socket pair made without the switch (no message regions, no posted receives)."""

    socket: Any
    process: Any
    provider: Any
    proxy: Any

    def close(self) -> None:
        if not self.socket.closed and self.process.alive:
            self.provider.close_socket(self.socket)
