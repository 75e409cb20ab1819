"""What a registration pins (R8, R12), in bytes: the proxy's ``pinned_bytes`` (capability ``pinned_bytes``; on a
Linux host the kernel's own count, VmPin).

``live_allocations`` counts pins, and a pin that covers less than its registration counts as one all the same. The
bytes it leaves unpinned may move while the NIC still writes to where they were: a transfer inside the registered
range then lands outside it (R8), and the registration holds less than it needs (R12). So each scenario registers
memory of 64 KiB to more than 1 MiB, at an unaligned start and page-aligned, in pages no other registration
touches (a legal provider may share a pin between registrations of one page), and reads what the node holds
pinned while it lives and after it ends.
"""

from __future__ import annotations

from typing import cast

import pytest

from pytest_san import PAGE_SIZE, Access, Buffer
from pytest_san.spi.protocols import DirectIoProxy

from .support import RawEnd, page_apart

P = PAGE_SIZE
SIZES = [  # (start in its page, length)
    pytest.param(0, 1 << 16, id="64-KiB"),
    pytest.param(100, 1 << 20, id="1-MiB-unaligned"),
    pytest.param(P - 1, (1 << 20) + P + 2, id="past-1-MiB-straddling"),
]


def alone(end: RawEnd, start: int, length: int) -> Buffer:
    """``length`` bytes ``start`` bytes into a page, inside an allocation with a whole page on either side: no
    other registration can share a page with it."""
    whole, at = page_apart(end, start, length)
    return whole.view(at, length)


def register(end: RawEnd, kind: str, buffer: Buffer) -> object:
    if kind == "memory":
        return end.provider.register_memory(end.socket, buffer, Access.READWRITE)
    return end.provider.register_rdma_memory(end.socket, buffer, Access.READWRITE)


def deregister(end: RawEnd, kind: str, key: object) -> None:
    if kind == "memory":
        end.provider.deregister_memory(end.socket, key)
    else:
        end.provider.deregister_rdma_memory(end.socket, key)


@pytest.mark.san_rule("R8", "R12")
@pytest.mark.san_requires("pinned_bytes")
@pytest.mark.parametrize("kind", ["memory", "rdma"])
@pytest.mark.parametrize(("start", "length"), SIZES)
def test_a_registration_pins_every_byte_it_covers_until_it_ends(raw_pair: tuple[RawEnd, RawEnd], kind: str,
                                                                start: int, length: int) -> None:
    """While it lives, the node holds pinned at least every byte from the start of the registration's first page
    to its last byte (a host pins whole pages: more is legal); once it is deregistered, exactly what it held
    before."""
    a, _ = raw_pair
    buffer = alone(a, start, length)
    before = a.proxy.pinned_bytes()
    key = register(a, kind, buffer)
    held = a.proxy.pinned_bytes() - before
    covered = start + length
    assert held >= covered, (f"a {kind} registration of {length} bytes {start} bytes into a page pins {held} bytes, "
                             f"{covered - held} short of what it covers")
    deregister(a, kind, key)
    assert a.proxy.pinned_bytes() == before, "a pin outlived its registration"


@pytest.mark.san_rule("R12")
@pytest.mark.san_requires("pinned_bytes")
def test_registrations_of_one_buffer_pin_it_until_the_last_ends(raw_pair: tuple[RawEnd, RawEnd]) -> None:
    """Registered twice (the provider may pin once or twice, R12, R13), the buffer stays pinned whole until its
    last registration ends, whichever ends first."""
    a, _ = raw_pair
    buffer = alone(a, 0, 1 << 18)
    before = a.proxy.pinned_bytes()
    first = a.provider.register_memory(a.socket, buffer, Access.READ)
    second = a.provider.register_rdma_memory(a.socket, buffer, Access.READ)
    a.provider.deregister_memory(a.socket, first)
    assert a.proxy.pinned_bytes() - before >= buffer.length, "the first deregistration unpinned the second's pages"
    a.provider.deregister_rdma_memory(a.socket, second)
    assert a.proxy.pinned_bytes() == before


@pytest.mark.san_rule("R12", "P1")
@pytest.mark.san_requires("pinned_bytes", "direct_io")
def test_a_direct_io_pin_is_pinned_bytes_until_it_is_freed(raw_pair: tuple[RawEnd, RawEnd]) -> None:
    """The proxy's own pins of a buffer's pages (``DirectIoProxy.pin``, P1) are pinned bytes as a registration's
    are: at least the buffer's bytes while the pin lives, and nothing once it is freed."""
    a, _ = raw_pair
    buffer = alone(a, 100, 3 * P)
    before = a.proxy.pinned_bytes()
    pin = cast(DirectIoProxy, a.proxy).pin(buffer)
    assert a.proxy.pinned_bytes() - before >= buffer.length
    a.proxy.free(pin)
    assert a.proxy.pinned_bytes() == before
