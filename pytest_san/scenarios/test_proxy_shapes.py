"""The proxy driver over shapes (P2-P5): seeded sequences of allocations and frees of every kind and size, the
live memory checked after every step, and contiguous requests at the exact edge of what fits.

Each sequence holds what the proxy handed out in its books and frees all of it at the end (in ``finally``), so
the leak check after each test sees the proxy as it was. Physical addresses are compared only with each other
and with the limits the caller named, never with where an allocator happens to put things.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pytest_san import FOUR_GIB, PAGE_SIZE, CacheType, DmaAdapter, Proxy, SanError, WsaError
from pytest_san.spi.protocols import Allocation

from .support import expect_error
from .test_proxy import free_all, nic, overlapping

P = PAGE_SIZE
SEEDS = (1, 2, 3)
SIZES = (1, P - 1, P, P + 1, 2 * P, 3 * P + 5, 5 * P, 16 * P + 17)
BOUNDARIES = (0, P, 2 * P, 4 * P, 16 * P, 1 << 20)


def pages(nbytes: int) -> int:
    return -(-nbytes // P) * P


@dataclasses.dataclass
class Books:
    """What one sequence holds: page allocations (and whether NOLOWMEM was on when each was made), contiguous
    blocks, common buffers; everything freed by ``release``."""

    proxy: Proxy
    allocations: list[tuple[Allocation, bool]] = dataclasses.field(default_factory=list)
    blocks: list[tuple[int, int, CacheType]] = dataclasses.field(default_factory=list)
    buffers: list[tuple[DmaAdapter, int, int, int, bool]] = dataclasses.field(default_factory=list)

    def runs(self) -> list[tuple[int, int]]:
        """Every live physical range: the allocations' runs, the blocks, the common buffers (whole pages)."""
        out = [run for a, _ in self.allocations for run in a.physical_runs]
        out += [(base, pages(n)) for base, n, _ in self.blocks]
        out += [(logical, pages(length)) for _, length, logical, _, _ in self.buffers]
        return out

    def count(self) -> int:
        return len(self.allocations) + len(self.blocks) + len(self.buffers)

    def release(self) -> None:
        while self.allocations:
            self.proxy.free(self.allocations.pop()[0])
        while self.blocks:
            base, n, cache = self.blocks.pop()
            self.proxy.free_contiguous(base, n, cache)
        while self.buffers:
            adapter, length, logical, virtual, cached = self.buffers.pop()
            adapter.free_common_buffer(length, logical, virtual, cached)


@contextmanager
def books(proxy: Proxy) -> Iterator[Books]:
    held = Books(proxy)
    before = proxy.live_allocations()
    try:
        yield held
    finally:
        held.release()
    assert proxy.live_allocations() == before, "freeing everything did not bring the proxy back to where it was"


def check(held: Books, before: int) -> None:
    """What must hold after every step, whatever the step was."""
    for allocation, low_allowed in held.allocations:
        runs = allocation.physical_runs
        assert runs and all(a % P == 0 and n > 0 for a, n in runs), f"{allocation!r}: {runs}"
        assert sum(n for _, n in runs) >= allocation.length, f"{allocation!r} has fewer pages than bytes"
        if not low_allowed:
            assert all(a >= FOUR_GIB for a, _ in runs), f"made under NOLOWMEM, yet below 4 GiB: {runs}"
    assert not overlapping(held.runs()), "two live allocations share physical memory"
    assert held.proxy.live_allocations() == before + held.count()


def drop_one(rng: random.Random, held: Books) -> None:
    """Free one live thing, chosen at random (so that frees leave holes between live allocations)."""
    kinds = [k for k, things in (("a", held.allocations), ("b", held.blocks), ("c", held.buffers)) if things]
    kind = rng.choice(kinds)
    if kind == "a":
        held.proxy.free(held.allocations.pop(rng.randrange(len(held.allocations)))[0])
    elif kind == "b":
        base, n, cache = held.blocks.pop(rng.randrange(len(held.blocks)))
        held.proxy.free_contiguous(base, n, cache)
    else:
        adapter, length, logical, virtual, cached = held.buffers.pop(rng.randrange(len(held.buffers)))
        adapter.free_common_buffer(length, logical, virtual, cached)


# -- P2, P3: page allocations, with holes ---------------------------------------------------------


@pytest.mark.san_rule("P2")
@pytest.mark.san_requires("physical_addresses")
@pytest.mark.parametrize("seed", SEEDS)
def test_allocations_in_any_order_stay_distinct_pages(san_proxy: Proxy, seed: int) -> None:
    """Allocate and free at random, sizes from one byte to many pages: frees leave holes, later allocations
    must fill them or go around them, never share a page with a live one."""
    rng = random.Random(seed)
    before = san_proxy.live_allocations()
    with books(san_proxy) as held:
        for _ in range(120):
            if held.allocations and rng.random() < 0.4:
                drop_one(rng, held)
            else:
                held.allocations.append((san_proxy.allocate(rng.choice(SIZES)), True))
            check(held, before)


@pytest.mark.san_rule("P2", "P3")
@pytest.mark.san_requires("nolowmem", "physical_addresses")
@pytest.mark.parametrize("seed", SEEDS)
def test_nolowmem_allocations_stay_above_4_gib_through_holes(san_proxy: Proxy, seed: int) -> None:
    """NOLOWMEM switched on and off in the middle of allocating and freeing: whatever holes the frees left (low
    and high), what is allocated under NOLOWMEM lies wholly above 4 GiB."""
    rng = random.Random(seed)
    before = san_proxy.live_allocations()
    initially = san_proxy.nolowmem
    try:
        with books(san_proxy) as held:
            for step in range(150):
                if step % 25 == 0:
                    san_proxy.set_nolowmem(rng.random() < 0.7)
                if held.allocations and rng.random() < 0.4:
                    drop_one(rng, held)
                else:
                    on = san_proxy.nolowmem
                    held.allocations.append((san_proxy.allocate(rng.choice(SIZES)), not on))
                check(held, before)
    finally:
        san_proxy.set_nolowmem(initially)


# -- P4: contiguous blocks ------------------------------------------------------------------------


@pytest.mark.san_rule("P2", "P4")
@pytest.mark.san_requires("contiguous", "physical_addresses")
@pytest.mark.parametrize("seed", SEEDS)
def test_contiguous_blocks_keep_their_limits_among_other_allocations(san_proxy: Proxy, seed: int) -> None:
    """Contiguous requests of random size, range, boundary and cache type, between page allocations and frees:
    a block granted is page aligned, inside [lowest, highest], crosses no boundary multiple and shares no page
    with anything live."""
    rng = random.Random(seed)
    before = san_proxy.live_allocations()
    with books(san_proxy) as held:
        for _ in range(100):
            roll = rng.random()
            if held.count() and roll < 0.3:
                drop_one(rng, held)
            elif roll < 0.5:
                held.allocations.append((san_proxy.allocate(rng.choice(SIZES)), True))
            else:
                nbytes = rng.choice(SIZES)
                lowest = rng.choice((0, P, FOUR_GIB // 2 + 123, FOUR_GIB - 64 * P, FOUR_GIB))
                highest = lowest + rng.choice((nbytes - 1, pages(nbytes) + P - 1, 64 * P, 1 << 30))
                boundary = rng.choice(BOUNDARIES)
                cache = rng.choice(list(CacheType))
                base = san_proxy.allocate_contiguous(nbytes, lowest, highest, boundary, cache)
                if base is None:
                    continue
                held.blocks.append((base, nbytes, cache))
                assert base % P == 0, f"{base:#x} is not page aligned"
                assert lowest <= base and base + nbytes - 1 <= highest, \
                    f"{nbytes} bytes at {base:#x}: outside [{lowest:#x}, {highest:#x}]"
                assert not boundary or base // boundary == (base + nbytes - 1) // boundary, \
                    f"{nbytes} bytes at {base:#x} cross a multiple of {boundary:#x}"
            check(held, before)


@contextmanager
def just_freed(proxy: Proxy, nbytes: int, cache: CacheType) -> Iterator[int]:
    """The base of a block of ``nbytes`` below 4 GiB that was just freed: a range known to be free."""
    base = proxy.allocate_contiguous(nbytes, 0, FOUR_GIB - 1, 0, cache)
    assert base is not None, f"no {nbytes} contiguous bytes below 4 GiB"
    proxy.free_contiguous(base, nbytes, cache)
    yield base


def grant(proxy: Proxy, nbytes: int, lowest: int, highest: int, boundary: int, cache: CacheType) -> int | None:
    """allocate_contiguous, the block freed at once: only where it was matters."""
    base = proxy.allocate_contiguous(nbytes, lowest, highest, boundary, cache)
    if base is not None:
        proxy.free_contiguous(base, nbytes, cache)
    return base


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
@pytest.mark.parametrize("npages", [1, 2, 5])
def test_contiguous_fits_a_free_range_to_the_byte(san_proxy: Proxy, npages: int) -> None:
    """A range that is free and exactly as big as the request is granted, at its start; a byte less, at either
    end, and it is impossible (None)."""
    n, cache = npages * P, CacheType.CACHED
    before = san_proxy.live_allocations()
    with just_freed(san_proxy, n, cache) as b:
        assert grant(san_proxy, n, b, b + n - 1, 0, cache) == b, "an exactly fitting free range refused"
        assert grant(san_proxy, n - 1, b, b + n - 1, 0, cache) == b, "n - 1 bytes: the same pages"
        assert grant(san_proxy, n, b, b + n - 2, 0, cache) is None, "granted past highest"
        assert grant(san_proxy, n, b + 1, b + n, 0, cache) is None, "granted below lowest, or not page aligned"
        assert grant(san_proxy, n + 1, b, b + n - 1, 0, cache) is None, "one byte more than the range holds"
        assert grant(san_proxy, P, b, b + n - 1, P, cache) is not None, "a page, within a page boundary: refused"
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
def test_contiguous_takes_the_free_part_of_a_range(san_proxy: Proxy) -> None:
    """A range whose first pages are taken: a block granted in it comes from its free rest, never from the taken
    pages, and none is granted when the rest is too small. A proxy may refuse a block the free rest could hold
    (P4 promises none when impossible, not one whenever possible: the verbs proxy's hugetlb pool refuses it)."""
    n, cache = 4 * P, CacheType.NON_CACHED
    with just_freed(san_proxy, n, cache) as b:
        first = san_proxy.allocate_contiguous(P, b, b + P - 1, 0, cache)  # the range's first page, taken
        assert first == b
        try:
            assert grant(san_proxy, 3 * P, b, b + n - 1, 0, cache) in (None, b + P), "granted over the taken page"
            assert grant(san_proxy, n, b, b + n - 1, 0, cache) is None, "granted over a live block"
            # Two pages that may not cross a two-page multiple: [b + P, b + 4P) always holds such a pair.
            base = grant(san_proxy, 2 * P, b + P, b + n - 1, 2 * P, cache)
            if base is not None:
                assert b + P <= base and base + 2 * P <= b + n and base // (2 * P) == (base + 2 * P - 1) // (2 * P)
        finally:
            san_proxy.free_contiguous(b, P, cache)


@pytest.mark.san_rule("P4")
@pytest.mark.san_requires("contiguous")
@pytest.mark.parametrize(("nbytes", "lowest", "highest", "boundary"), [
    pytest.param(0, 0, FOUR_GIB - 1, 0, id="zero-bytes"),
    pytest.param(-P, 0, FOUR_GIB - 1, 0, id="negative-size"),
    pytest.param(P, 0, FOUR_GIB - 1, -P, id="negative-boundary"),
])
def test_contiguous_of_no_size_or_a_negative_boundary_is_never_granted(san_proxy: Proxy, nbytes: int, lowest: int,
                                                                       highest: int, boundary: int) -> None:
    """Nothing to allocate, or no sense in the request: no block (None, or WSAEINVAL), and nothing held."""
    before = san_proxy.live_allocations()
    try:
        base = san_proxy.allocate_contiguous(nbytes, lowest, highest, boundary, CacheType.CACHED)
    except SanError as err:
        assert err.code is WsaError.WSAEINVAL, f"expected WSAEINVAL or None, got {err}"
    else:
        assert base is None, f"allocate_contiguous({nbytes}, ..., boundary={boundary}) granted {base:#x}"
    assert san_proxy.live_allocations() == before


# -- P5: common buffers among the rest --------------------------------------------------------------


@pytest.mark.san_rule("P2", "P3", "P5")
@pytest.mark.san_requires("dma_adapter", "contiguous", "nolowmem", "physical_addresses")
@pytest.mark.parametrize("seed", SEEDS)
def test_common_buffers_stay_apart_from_everything_live(san_proxy: Proxy, seed: int) -> None:
    """Common buffers of a 32-bit and a 64-bit adapter, page allocations and contiguous blocks, NOLOWMEM on and
    off: each common buffer is its own pages, a 32-bit adapter's lies below 4 GiB, and under NOLOWMEM a 64-bit
    adapter's (no low memory asked for) lies above; each one counts as one live allocation."""
    rng = random.Random(seed)
    adapters = [san_proxy.get_dma_adapter(nic(dma32=True)), san_proxy.get_dma_adapter(nic(dma32=False, dma64=True))]
    initially = san_proxy.nolowmem
    try:
        before = san_proxy.live_allocations()
        with books(san_proxy) as held:
            for step in range(100):
                if step % 20 == 0:
                    san_proxy.set_nolowmem(rng.random() < 0.6)
                roll = rng.random()
                if held.count() and roll < 0.3:
                    drop_one(rng, held)
                elif roll < 0.5:
                    held.allocations.append((san_proxy.allocate(rng.choice(SIZES)), not san_proxy.nolowmem))
                elif roll < 0.6:
                    nbytes = rng.choice(SIZES)
                    base = san_proxy.allocate_contiguous(nbytes, 0, FOUR_GIB - 1, rng.choice(BOUNDARIES),
                                                         CacheType.CACHED)
                    if base is not None:
                        held.blocks.append((base, nbytes, CacheType.CACHED))
                else:
                    adapter = rng.choice(adapters)
                    length, cached = rng.choice(SIZES), rng.random() < 0.5
                    buf = adapter.allocate_common_buffer(length, cached)
                    assert buf is not None, f"no common buffer of {length} bytes"
                    virtual, logical = buf
                    held.buffers.append((adapter, length, logical, virtual, cached))
                    if adapter.dma32:
                        assert logical + length <= FOUR_GIB, f"32-bit adapter's buffer at {logical:#x}"
                    elif san_proxy.nolowmem:
                        assert logical >= FOUR_GIB, f"NOLOWMEM, yet a 64-bit adapter's buffer at {logical:#x}"
                check(held, before)
                assert len({v for _, _, _, v, _ in held.buffers}) == len(held.buffers), "two buffers, one address"
    finally:
        san_proxy.set_nolowmem(initially)
        for adapter in adapters:
            san_proxy.put_dma_adapter(adapter)


@pytest.mark.san_rule("P5")
@pytest.mark.san_requires("dma_adapter")
@pytest.mark.parametrize("length", [0, -P])
def test_a_common_buffer_of_no_size_is_never_granted(san_proxy: Proxy, length: int) -> None:
    adapter = san_proxy.get_dma_adapter(nic())
    try:
        before = san_proxy.live_allocations()
        try:
            buf = adapter.allocate_common_buffer(length, True)
        except SanError as err:
            assert err.code is WsaError.WSAEINVAL, f"expected WSAEINVAL or None, got {err}"
        else:
            assert buf is None, f"allocate_common_buffer({length}) granted {buf}"
        assert san_proxy.live_allocations() == before
    finally:
        san_proxy.put_dma_adapter(adapter)


# -- bad input: proxy sizes and addresses that are not ints -----------------------------------------

NOT_INTS = (1.0, True, "4096", None)


@pytest.mark.san_rule("P2", "P4", "P5")
@pytest.mark.san_requires("contiguous", "dma_adapter")
@pytest.mark.parametrize("bad", NOT_INTS, ids=repr)
def test_proxy_sizes_and_addresses_that_are_not_ints_are_wsaeinval(san_proxy: Proxy, bad: object) -> None:
    """Each size, address and boundary of each proxy call, in turn not an int: WSAEINVAL, nothing held, nothing
    freed (the block and buffer named stay live and are freed after with the right values)."""
    before = san_proxy.live_allocations()
    ok = (P, 0, FOUR_GIB - 1, 0)
    for i in range(4):
        contiguous: list[object] = list(ok)
        contiguous[i] = bad
        expect_error(WsaError.WSAEINVAL, san_proxy.allocate_contiguous, *contiguous, CacheType.CACHED)
    expect_error(WsaError.WSAEINVAL, san_proxy.allocate, bad)
    assert san_proxy.live_allocations() == before
    base = san_proxy.allocate_contiguous(P, 0, FOUR_GIB - 1, 0, CacheType.CACHED)
    assert base is not None
    adapter = san_proxy.get_dma_adapter(nic())
    try:
        expect_error(WsaError.WSAEINVAL, adapter.allocate_common_buffer, bad, True)
        buf = adapter.allocate_common_buffer(P, True)
        assert buf is not None
        virtual, logical = buf
        live = san_proxy.live_allocations()
        for common in [(bad, logical, virtual, True), (P, bad, virtual, True), (P, logical, bad, True)]:
            expect_error(WsaError.WSAEINVAL, adapter.free_common_buffer, *common)
        for block in [(bad, P), (base, bad)]:
            expect_error(WsaError.WSAEINVAL, san_proxy.free_contiguous, *block, CacheType.CACHED)
        assert san_proxy.live_allocations() == live, "a refused free released something"
        adapter.free_common_buffer(P, logical, virtual, True)
    finally:
        san_proxy.free_contiguous(base, P, CacheType.CACHED)
        san_proxy.put_dma_adapter(adapter)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P2")
@pytest.mark.parametrize("bad", [0, -P, *NOT_INTS], ids=repr)
def test_a_refused_allocation_leaves_the_proxy_as_it_was(san_proxy: Proxy, bad: Any) -> None:
    """No size, a negative one or no int at all: refused (a SanError), and the proxy allocates as before."""
    before = san_proxy.live_allocations()
    with pytest.raises(SanError):
        san_proxy.allocate(bad)  # a size that is no int, on purpose
    assert san_proxy.live_allocations() == before
    held = [san_proxy.allocate(nbytes) for nbytes in (1, P, 3 * P)]  # each refused call changed nothing
    free_all(san_proxy, held)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P5")
@pytest.mark.san_requires("dma_adapter")
@pytest.mark.parametrize(("field", "value"), [
    ("version", "2"), ("version", 2.0), ("version", True), ("maximum_length", 1.5), ("maximum_length", True),
    ("interface_type", "5"), ("master", 1), ("scatter_gather", "yes"), ("dma32", 1), ("dma64", 0),
])
def test_a_description_field_of_the_wrong_type_is_wsaeinval(san_proxy: Proxy, field: str, value: object) -> None:
    """Each field of an otherwise good DEVICE_DESCRIPTION in turn of the wrong type: WSAEINVAL, no adapter."""
    before = san_proxy.live_allocations()
    description = nic()
    setattr(description, field, value)
    expect_error(WsaError.WSAEINVAL, san_proxy.get_dma_adapter, description)
    assert san_proxy.live_allocations() == before


@pytest.mark.san_rule("P5")
@pytest.mark.san_requires("dma_adapter")
def test_an_adapter_once_put_is_gone(san_proxy: Proxy) -> None:
    """Put, an adapter is gone: putting it again and allocating from it are WSAEINVAL, and change nothing."""
    before = san_proxy.live_allocations()
    adapter = san_proxy.get_dma_adapter(nic())
    san_proxy.put_dma_adapter(adapter)
    assert san_proxy.live_allocations() == before
    expect_error(WsaError.WSAEINVAL, san_proxy.put_dma_adapter, adapter)
    expect_error(WsaError.WSAEINVAL, adapter.allocate_common_buffer, P, True)
    assert san_proxy.live_allocations() == before
