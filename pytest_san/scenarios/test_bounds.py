"""Bounds where real memory goes wrong (R6, R7, R8): registrations that start and end anywhere in a page.

A host maps whole pages and pins whole pages, so a provider that checks a range against what it pinned, rather
than what the caller registered, is right at page boundaries and wrong everywhere else. Each scenario registers
a range at an unaligned start, of an odd length, inside one page, ending one byte into a page, of 64 KiB, or of
more than 1 MiB (where a length kept in 16 or 20 bits wraps), inside a larger allocation whose other bytes are
guards: a probe one byte past either end must be rejected and move nothing; one exactly at either end must land
exactly there. One probe per test: on verbs a rejected transfer breaks the
connection, and the next probe would be rejected for that instead. The guards lie inside the allocation (never
between its end and the end of its page, which no scenario relies on).
"""

from __future__ import annotations

import dataclasses

import pytest

from pytest_san import PAGE_SIZE, Access, Backend, Buffer

from .support import (
    GUARD_BYTE,
    NEEDS_READ,
    RawEnd,
    attempt,
    fresh_pair,
    lay_out,
    page_apart,
    read_from,
    receive,
    rejected,
    scatter_shapes,
    succeeded,
    transfer_is_rejected,
    two_processes,
    write_into,
)

P = PAGE_SIZE
GEOMETRIES = [  # (start in its page, length)
    pytest.param(0, 333, id="odd-length"),
    pytest.param(1000, 24, id="sub-page"),
    pytest.param(0, P + 1, id="one-byte-into-a-page"),
    pytest.param(P - 7, P + 14, id="straddling-pages"),
    pytest.param(0, 1 << 16, id="64-KiB"),  # a 16-bit length field holds 0 for it
    pytest.param(100, (1 << 20) + 1, id="past-1-MiB"),  # and 1 for this one, as does a 20-bit one
]


@dataclasses.dataclass
class Region:
    """``inner``: ``length`` bytes ``start`` bytes into a page, inside ``whole``, whose other bytes are guards."""

    whole: Buffer
    inner: Buffer
    at: int  # where ``inner`` starts in ``whole``
    fill: int

    def intact(self) -> bool:
        """Every byte of ``whole`` outside ``inner`` is still a guard."""
        data = self.whole.read()
        return set(data[:self.at]) | set(data[self.at + self.inner.length:]) <= {GUARD_BYTE}

    def unchanged(self) -> bool:
        return self.intact() and self.inner.read() == bytes([self.fill]) * self.inner.length


def region(end: RawEnd, start: int, length: int, fill: int = 0x22) -> Region:
    whole, at = page_apart(end, start, length)  # a whole page of guards before the region's page, one or more after
    whole.write(bytes([GUARD_BYTE]) * at + bytes([fill]) * length + bytes([GUARD_BYTE]) * (whole.length - at - length))
    return Region(whole, whole.view(at, length), at, fill)


def window(end: RawEnd, start: int, length: int, access: Access) -> tuple[Region, bytes]:
    r = region(end, start, length)
    return r, end.provider.register_rdma_memory(end.socket, r.inner, access)


PROBES = ["before-the-start", "past-the-end", "across-the-end"]
"""Transfers that reach exactly one byte outside a registration."""


def probe(name: str, length: int) -> tuple[int, int]:
    """(offset, bytes) of the probe ``name`` for a registration of ``length`` bytes."""
    return {"before-the-start": (-1, 1), "past-the-end": (length, 1), "across-the-end": (length - 1, 2)}[name]


# -- RDMA descriptors ------------------------------------------------------------------------------


@pytest.mark.san_rule("R8")
@pytest.mark.parametrize(("start", "length"), GEOMETRIES)
@pytest.mark.parametrize("where", PROBES)
def test_write_one_byte_outside_a_window_is_rejected(raw_pair: tuple[RawEnd, RawEnd], start: int, length: int,
                                                     where: str) -> None:
    a, b = raw_pair
    target, desc = window(b, start, length, Access.WRITE)
    offset, nbytes = probe(where, length)
    assert rejected(write_into(a, desc, b"\x99" * nbytes, offset))
    assert target.unchanged()


@pytest.mark.san_rule("R8")
@NEEDS_READ
@pytest.mark.parametrize(("start", "length"), GEOMETRIES)
def test_read_across_the_end_of_a_window_is_rejected(raw_pair: tuple[RawEnd, RawEnd], start: int,
                                                     length: int) -> None:
    a, b = raw_pair
    target, desc = window(b, start, length, Access.READ)
    outcome, landed = read_from(a, desc, 2, length - 1)
    assert rejected(outcome) and landed.unchanged() and target.unchanged()


@pytest.mark.san_rule("R8")
@pytest.mark.parametrize(("start", "length"), GEOMETRIES)
def test_writes_at_both_ends_of_a_window_land_exactly(raw_pair: tuple[RawEnd, RawEnd], start: int,
                                                      length: int) -> None:
    a, b = raw_pair
    target, desc = window(b, start, length, Access.WRITE)
    assert succeeded(write_into(a, desc, b"\x01", 0), 1)
    assert succeeded(write_into(a, desc, b"\x02", length - 1), 1)
    assert target.inner.read() == b"\x01" + bytes([target.fill]) * (length - 2) + b"\x02"
    assert target.intact()


@pytest.mark.san_rule("R6")
@pytest.mark.parametrize(("start", "length"), GEOMETRIES)
def test_write_into_an_unaligned_read_window_is_rejected(raw_pair: tuple[RawEnd, RawEnd], start: int,
                                                         length: int) -> None:
    a, b = raw_pair
    target, desc = window(b, start, length, Access.READ)
    assert rejected(write_into(a, desc, b"\x99" * length, 0))
    assert target.unchanged()


@pytest.mark.san_rule("R7")
@NEEDS_READ
@pytest.mark.parametrize(("start", "length"), GEOMETRIES)
def test_read_from_an_unaligned_write_window_is_rejected(raw_pair: tuple[RawEnd, RawEnd], start: int,
                                                         length: int) -> None:
    a, b = raw_pair
    _, desc = window(b, start, length, Access.WRITE)
    outcome, landed = read_from(a, desc, length, 0)
    assert rejected(outcome) and landed.unchanged()


# -- register_memory handles -----------------------------------------------------------------------


LOCAL_PROBES = ["across-the-start", "across-the-end"]
"""Local buffers of two bytes, one inside the registration, one outside it."""


def local_probe(name: str, r: Region) -> Buffer:
    at = r.at - 1 if name == "across-the-start" else r.at + r.inner.length - 1
    return r.whole.view(at, 2)


@pytest.mark.san_rule("R8")
@pytest.mark.parametrize(("start", "length"), GEOMETRIES)
@pytest.mark.parametrize("where", LOCAL_PROBES)
def test_source_one_byte_outside_its_registration_is_rejected(raw_pair: tuple[RawEnd, RawEnd], start: int,
                                                              length: int, where: str) -> None:
    a, b = raw_pair
    local = region(a, start, length, fill=0x5A)
    handle = a.provider.register_memory(a.socket, local.inner, Access.READ)
    target, desc = window(b, 0, 64, Access.WRITE)
    assert rejected(attempt(lambda: a.provider.rdma_write(a.socket, [(local_probe(where, local), handle)], desc, 0)))
    assert target.unchanged()


@pytest.mark.san_rule("R8")
@pytest.mark.parametrize(("start", "length"), GEOMETRIES)
@pytest.mark.parametrize("where", LOCAL_PROBES)
def test_sink_one_byte_outside_its_registration_is_rejected(raw_pair: tuple[RawEnd, RawEnd], start: int,
                                                            length: int, where: str) -> None:
    a, b = raw_pair
    local = region(b, start, length, fill=0x5A)
    handle = b.provider.register_memory(b.socket, local.inner, Access.WRITE)
    assert rejected(receive(a, b, [(local_probe(where, local), handle)], b"\x99\x99"))
    assert local.unchanged()


@pytest.mark.san_rule("R8")
@pytest.mark.parametrize(("start", "length"), GEOMETRIES)
def test_sources_at_both_ends_of_a_registration_are_taken(raw_pair: tuple[RawEnd, RawEnd], start: int,
                                                          length: int) -> None:
    a, b = raw_pair
    local = region(a, start, length, fill=0x5A)
    handle = a.provider.register_memory(a.socket, local.inner, Access.READ)
    local.inner.write(b"\x01", 0)
    local.inner.write(b"\x02", length - 1)
    target, desc = window(b, 0, 2, Access.WRITE)
    ends = [(local.inner.view(0, 1), handle), (local.inner.view(length - 1, 1), handle)]
    assert succeeded(attempt(lambda: a.provider.rdma_write(a.socket, ends, desc, 0)), 2)
    assert target.inner.read() == b"\x01\x02" and target.intact()


@pytest.mark.san_rule("R6")
@pytest.mark.parametrize(("start", "length"), GEOMETRIES)
def test_unaligned_read_handle_as_receive_sink_is_rejected(raw_pair: tuple[RawEnd, RawEnd], start: int,
                                                           length: int) -> None:
    a, b = raw_pair
    local = region(b, start, length)
    handle = b.provider.register_memory(b.socket, local.inner, Access.READ)
    assert rejected(receive(a, b, [(local.inner, handle)], b"\x99" * length))
    assert local.unchanged()


# -- scatter lists: one entry one byte outside its registration, wherever it is in the list ---------


@pytest.mark.san_rule("R8")
@pytest.mark.parametrize("kind", ["send", "recv", "rdma_write",
                                  pytest.param("rdma_read", marks=[NEEDS_READ,
                                                                   pytest.mark.san_requires("rdma_read_scatter")])])
def test_entry_one_byte_outside_its_registration_anywhere_in_a_list_is_rejected(san_backend: Backend,
                                                                                kind: str) -> None:
    """Each entry is registered alone, with the access the call needs; the bad one's range starts one byte
    before its registration or ends one byte after it (in guard bytes of the same allocation). For each shape
    (``MAX_SGE`` entries with the bad one first, in the middle, last; then drawn ones) the call is rejected and
    no byte moves: a provider that checks only the first entry, or only the handles, lets it through."""
    pa, pb = two_processes(san_backend)
    for shape in scatter_shapes("entry-outside-its-registration", kind):
        n = len(shape.lengths)
        with fresh_pair(san_backend, pa, pb) as (a, b):
            local = lay_out(san_backend, a, shape.lengths, shape.accesses, [0x30 + i for i in range(n)])
            reach = (1, 0) if shape.side == "before" else (0, 1)
            entries = [(local.entry(i, *reach) if i == shape.bad else local.entry(i), handle)
                       for i, handle in enumerate(local.handles)]
            transfer_is_rejected(san_backend, a, b, kind, entries, local.unchanged, f"{kind}, {shape}")


@pytest.mark.san_rule("R8")
@pytest.mark.parametrize("kind", ["memory", "rdma"])
def test_a_registration_inside_a_wider_one_keeps_its_own_bounds(raw_pair: tuple[RawEnd, RawEnd], kind: str) -> None:
    """A provider may cache registrations and share what it pins, but a range registered inside a wider
    registration of the same memory is bounded by what was registered: its key reaches one byte past its end
    no more than if it were alone, though the wider registration covers that byte."""
    a, b = raw_pair
    if kind == "rdma":
        target = region(b, 100, 256)
        b.provider.register_rdma_memory(b.socket, target.whole, Access.READWRITE)
        desc = b.provider.register_rdma_memory(b.socket, target.inner, Access.WRITE)
        assert rejected(write_into(a, desc, b"\x99" * 2, 255))
        assert target.unchanged()
    else:
        local = region(a, 100, 256, fill=0x5A)
        a.provider.register_memory(a.socket, local.whole, Access.READWRITE)
        handle = a.provider.register_memory(a.socket, local.inner, Access.READ)
        sink_region, desc = window(b, 0, 64, Access.WRITE)
        outside = local_probe("across-the-end", local)
        assert rejected(attempt(lambda: a.provider.rdma_write(a.socket, [(outside, handle)], desc, 0)))
        assert sink_region.unchanged()
