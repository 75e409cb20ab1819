"""pytest_san.spi.burst beyond what the scenarios check: which implementation runs, a full queue, a refused post."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pytest_san import Access, SanError, Status, WsaError
from pytest_san.spi.burst import BurstProvider, WindowedBurst, rdma_read_burst, rdma_write_burst, runs_bursts
from pytest_san.spi.emulator import EmulatorBackend
from pytest_san.spi.emulator.provider import QUEUE_DEPTH

SIZE = 1024


@pytest.fixture
def pair() -> Iterator[tuple[Any, ...]]:
    """(backend, provider, socket, [(source, handle)], target buffer, WRITE descriptor) between two nodes."""
    backend = EmulatorBackend(2)
    pa, pb = backend.nodes[0].default_process, backend.nodes[1].default_process
    sa, sb = backend.connect_sockets(pa, pb)
    src = pa.alloc(SIZE)
    src.write(bytes(range(256)) * (SIZE // 256))
    handle = pa.node.provider.register_memory(sa, src, Access.READ)
    dst = pb.alloc(SIZE)
    desc = pb.node.provider.register_rdma_memory(sb, dst, Access.WRITE)
    yield backend, pa.node.provider, sa, [(src, handle)], dst, desc
    for sock in (sa, sb):
        if not sock.closed:
            sock.provider.close_socket(sock)
    assert backend.leaks() == []
    backend.close()


class Refusing:
    """Only the plain SPI (no burst methods): its ``rdma_write`` refuses from the ``refuse_at``-th call on."""

    def __init__(self, inner: Any, refuse_at: int) -> None:
        self.inner = inner
        self.calls = 0
        self.refuse_at = refuse_at

    def rdma_write(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls >= self.refuse_at:
            raise SanError(WsaError.WSAENOTCONN, "refused for the test")
        return self.inner.rdma_write(*args)


def test_a_provider_without_bursts_gets_the_windowed_loop(pair: tuple[Any, ...]) -> None:
    _, provider, sock, local, dst, desc = pair
    assert not isinstance(provider, BurstProvider)  # the emulator implements only the SPI
    burst = rdma_write_burst(provider, sock, local, desc, count=50, depth=8)
    assert isinstance(burst, WindowedBurst)
    done = burst.wait(5)
    assert done.status is Status.SUCCESS and done.bytes == 50 * SIZE
    assert dst.read() == local[0][0].read()


def test_a_provider_with_bursts_runs_its_own() -> None:
    seen: list[tuple[Any, ...]] = []

    class Native:
        def rdma_write_burst(self, *args: Any) -> str:
            seen.append(("write", *args))
            return "its own"

        def rdma_read_burst(self, *args: Any) -> str:
            seen.append(("read", *args))
            return "its own"

    provider: Any = Native()
    assert isinstance(provider, BurstProvider)
    assert rdma_write_burst(provider, "s", [], b"d", 8, count=3, depth=2) == "its own"
    assert rdma_read_burst(provider, "s", [], b"d", count=5) == "its own"
    assert seen == [("write", "s", [], b"d", 8, 3, 2), ("read", "s", [], b"d", 0, 5, 16)]


def test_a_wrapper_forwarding_by_getattr_gets_bursts_of_its_own_calls(pair: tuple[Any, ...]) -> None:
    """A provider under test that wraps one with bursts (hil's stand-in has them) and forwards what it lacks:
    the burst is made of the wrapper's rdma_write calls, so what it does to a transfer it does to each."""
    _, provider, sock, local, _, desc = pair

    class WithBursts:  # the wrapped provider runs bursts itself, next to its NIC
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def rdma_write_burst(self, *args: Any) -> Any:
            raise AssertionError("the wrapper's own rdma_write was bypassed")

        rdma_read_burst = rdma_write_burst

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    class Counting:  # the provider under test: counts its writes, forwards everything else
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.writes = 0

        def rdma_write(self, *args: Any) -> Any:
            self.writes += 1
            return self.inner.rdma_write(*args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    wrapper = Counting(WithBursts(provider))
    assert runs_bursts(WithBursts(provider)) and not runs_bursts(wrapper)
    done = rdma_write_burst(wrapper, sock, local, desc, count=20, depth=4).wait(5)  # type: ignore[arg-type]
    assert done.status is Status.SUCCESS and done.bytes == 20 * SIZE and wrapper.writes == 20


def test_a_full_send_queue_narrows_the_window(pair: tuple[Any, ...]) -> None:
    backend, provider, sock, local, _, desc = pair
    backend.faults.hold(sock)  # everything posted waits: the queue fills at QUEUE_DEPTH
    burst = rdma_write_burst(provider, sock, local, desc, count=QUEUE_DEPTH + 10, depth=QUEUE_DEPTH + 5)
    assert not burst.done()
    assert isinstance(burst, WindowedBurst) and burst.posted == QUEUE_DEPTH and burst.depth == QUEUE_DEPTH
    backend.faults.release(sock)
    done = burst.wait(5)
    assert done.status is Status.SUCCESS and done.bytes == (QUEUE_DEPTH + 10) * SIZE


def test_a_post_refused_mid_burst_ends_it_aborted_with_what_moved(pair: tuple[Any, ...]) -> None:
    _, provider, sock, local, _, desc = pair
    refusing = Refusing(provider, refuse_at=5)
    burst = rdma_write_burst(refusing, sock, local, desc, count=20, depth=2)  # type: ignore[arg-type]
    done = burst.wait(5)
    assert done.status is Status.ABORTED and done.bytes == 4 * SIZE
    assert isinstance(burst, WindowedBurst) and burst.error is not None
    assert burst.error.code is WsaError.WSAENOTCONN and refusing.calls == 5  # nothing posted after it


def test_the_first_post_raises_at_the_call(pair: tuple[Any, ...]) -> None:
    _, provider, sock, local, _, _ = pair
    with pytest.raises(SanError) as err:
        rdma_write_burst(provider, sock, local, b"too short", count=4)
    assert err.value.code is WsaError.WSAEINVAL


def test_an_error_completion_stops_the_burst(pair: tuple[Any, ...]) -> None:
    _, provider, sock, local, dst, _ = pair
    read_only = sock.peer.provider.register_rdma_memory(sock.peer, dst, Access.READ)
    before = dst.read()
    calls = Refusing(provider, refuse_at=10**9)
    done = rdma_write_burst(calls, sock, local, read_only, count=30, depth=4).wait(5)  # type: ignore[arg-type]
    assert done.status is Status.ACCESS_VIOLATION and done.bytes == 0
    assert calls.calls == 1  # the emulator completes at once: nothing was posted after the failure
    assert dst.read() == before
