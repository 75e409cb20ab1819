"""PhysicalMemory: free extents, first-fit page allocation, contiguous blocks, checked frees."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from pytest_san.emulator.memory import DEFAULT_SIZE, RESERVED_BELOW, PhysicalMemory, Run
from pytest_san.types import FOUR_GIB, PAGE_SIZE

P = PAGE_SIZE


def small(pages: int = 16) -> PhysicalMemory:
    """A memory of ``pages`` usable pages starting at 1 MiB."""
    return PhysicalMemory(size=RESERVED_BELOW + pages * P)


def test_default_map_is_6_gib_above_the_first_mib() -> None:
    m = PhysicalMemory()
    assert (m.start, m.end) == (0x100000, 6 << 30) == (RESERVED_BELOW, DEFAULT_SIZE)
    assert m.extents() == [(0x100000, 6 << 30)]
    assert m.free_bytes == m.total_bytes == (6 << 30) - 0x100000
    assert m.end > FOUR_GIB  # there is memory on both sides of the 4 GiB line


@pytest.mark.parametrize(("size", "reserved"), [(0x100001, 0x1000), (0x200000, 0x800), (0x100000, 0x100000)])
def test_bad_geometry_is_refused(size: int, reserved: int) -> None:
    with pytest.raises(ValueError):
        PhysicalMemory(size=size, reserved_below=reserved)


def test_single_pages_come_first_fit_from_the_bottom_and_merge_back() -> None:
    m = small()
    a, b, c = (m.allocate_pages(1) for _ in range(3))
    assert (a, b, c) == ([(0x100000, P)], [(0x101000, P)], [(0x102000, P)])
    assert m.extents() == [(0x103000, m.end)]
    assert a is not None and b is not None and c is not None
    m.free(a)
    m.free(c)  # merges with the tail extent
    assert m.extents() == [(0x100000, 0x101000), (0x102000, m.end)]
    m.free(b)  # fills the gap: everything is one extent again
    assert m.extents() == [(m.start, m.end)]
    assert m.free_bytes == m.total_bytes


def test_free_merges_with_previous_extent_only() -> None:
    m = small(8)
    runs = [m.allocate_pages(1) for _ in range(8)]
    assert m.extents() == []
    assert all(r is not None for r in runs)
    m.free_run(0x100000, P)
    m.free_run(0x101000, P)  # adjacent to the previous extent's end
    assert m.extents() == [(0x100000, 0x102000)]
    m.free_run(0x105000, P)  # isolated
    assert m.extents() == [(0x100000, 0x102000), (0x105000, 0x106000)]


@pytest.mark.parametrize(("address", "nbytes", "words"), [
    (0x102000, P, "not allocated"),             # already free
    (0x0, P, "outside"),                        # in the reserved first MiB
    (0x100000 + 16 * P, P, "outside"),          # past the end
    (0x100800, P, "page-aligned"),              # unaligned
    (0x101000, 100, "page-aligned"),            # partial page
    (0x101000, 0, "positive"),
])
def test_bad_frees_raise_value_error_naming_the_address(address: int, nbytes: int, words: str) -> None:
    m = small()
    assert m.allocate_pages(2) == [(0x100000, 2 * P)]  # the rest is free
    before = m.extents()
    with pytest.raises(ValueError, match=f"{address:#x}") as info:
        m.free_run(address, nbytes)
    assert words in str(info.value)
    assert m.extents() == before


def test_double_free_and_partial_overlap_are_refused() -> None:
    m = small()
    runs = m.allocate_pages(4)
    assert runs == [(0x100000, 4 * P)]
    m.free(runs)
    with pytest.raises(ValueError, match="0x100000"):
        m.free(runs)
    m.allocate_pages(2)
    with pytest.raises(ValueError, match="not allocated"):
        m.free_run(0x100000, 4 * P)  # half of it is free
    assert m.extents() == [(0x102000, m.end)]


def test_free_of_several_runs_is_all_or_nothing() -> None:
    m = small()
    a = m.allocate_pages(1)
    b = m.allocate_pages(1)
    assert a is not None and b is not None
    m.free(b)
    before = m.extents()
    with pytest.raises(ValueError):
        m.free(a + b)  # a is fine, b was already freed
    assert m.extents() == before
    assert not m.is_free(*a[0])


def test_scattered_allocation_takes_several_runs_first_fit() -> None:
    m = small(10)
    pages = [m.allocate_pages(1) for _ in range(10)]
    for i in (1, 3, 4, 8):  # holes of 1, 2 and 1 pages
        run = pages[i]
        assert run is not None
        m.free(run)
    runs = m.allocate_pages(3)
    assert runs == [(0x101000, P), (0x103000, 2 * P)]
    assert m.extents() == [(0x108000, 0x109000)]
    assert m.allocate_pages(2) is None  # one page left: refused, nothing taken
    assert m.extents() == [(0x108000, 0x109000)]


def test_out_of_memory_returns_none_and_changes_nothing() -> None:
    m = small(4)
    assert m.allocate_pages(5) is None
    assert m.extents() == [(m.start, m.end)]
    assert m.allocate_pages(4) == [(m.start, 4 * P)]
    assert m.allocate_pages(1) is None
    assert m.take(P) == -1


def test_min_address_keeps_pages_above_it() -> None:
    m = PhysicalMemory()
    runs = m.allocate_pages(3, min_address=FOUR_GIB)
    assert runs == [(FOUR_GIB, 3 * P)]
    assert m.extents() == [(m.start, FOUR_GIB), (FOUR_GIB + 3 * P, m.end)]
    # An unaligned minimum is rounded up to the next page.
    assert m.allocate_pages(1, min_address=FOUR_GIB + 3 * P + 1) == [(FOUR_GIB + 4 * P, P)]
    assert m.allocate_pages(1, min_address=m.end) is None
    m.free(runs)
    assert m.extents() == [(m.start, FOUR_GIB + 4 * P), (FOUR_GIB + 5 * P, m.end)]


def test_min_address_spreads_only_above_it() -> None:
    m = PhysicalMemory(size=FOUR_GIB + 4 * P)
    assert m.allocate_pages(2, min_address=FOUR_GIB) == [(FOUR_GIB, 2 * P)]
    m.free_run(FOUR_GIB, P)
    runs = m.allocate_pages(3, min_address=FOUR_GIB)
    assert runs == [(FOUR_GIB, P), (FOUR_GIB + 2 * P, 2 * P)]
    assert m.allocate_pages(1, min_address=FOUR_GIB) is None
    assert m.allocate_pages(1) == [(m.start, P)]  # low memory is still there for others


def test_take_is_the_single_run_fast_path() -> None:
    m = small(4)
    assert m.take(2 * P) == m.start
    assert m.take(2 * P) == m.start + 2 * P
    assert m.extents() == []
    m.free_run(m.start, P)
    m.free_run(m.start + 2 * P, 2 * P)
    assert m.take(2 * P) == -1  # the first extent is one page: the caller must spread
    assert m.allocate_pages(2) == [(m.start, P), (m.start + 2 * P, P)]
    for bad in (0, -P, P + 1):
        with pytest.raises(ValueError):
            m.take(bad)


def test_allocate_pages_refuses_non_positive_counts() -> None:
    with pytest.raises(ValueError):
        small().allocate_pages(0)


# -- contiguous ---------------------------------------------------------------------------------


def test_contiguous_comes_from_the_top_of_the_range() -> None:
    m = PhysicalMemory()
    base = m.allocate_contiguous(3 * P, 0, FOUR_GIB - 1)
    assert base == FOUR_GIB - 3 * P
    assert not m.is_free(FOUR_GIB - 3 * P, 3 * P)
    assert m.allocate_contiguous(P, 0, m.end + (1 << 40)) == m.end - P  # highest past the map
    m.free_run(base, 3 * P)
    assert m.extents() == [(m.start, m.end - P)]


def test_contiguous_rounds_up_to_pages() -> None:
    m = small()
    base = m.allocate_contiguous(1, 0, m.end - 1)
    assert base == m.end - P
    assert m.free_bytes == m.total_bytes - P


def test_contiguous_highest_is_the_last_acceptable_byte() -> None:
    m = small()
    lowest = m.start + 4 * P
    assert m.allocate_contiguous(2 * P, lowest, lowest + 2 * P - 1) == lowest  # exact fit
    assert m.allocate_contiguous(P, lowest, lowest + 3 * P - 2) is None  # last page would end 1 byte late
    assert m.allocate_contiguous(P, lowest + 1, lowest + 4 * P - 1) == lowest + 3 * P  # lowest rounds up


def test_contiguous_never_crosses_a_boundary_multiple() -> None:
    m = PhysicalMemory()
    boundary = 16 * P
    # The range ends one page past the 4 GiB multiple of the 64 KiB boundary: the top 3 pages
    # would straddle it, so the block moves down to end at the multiple.
    highest = FOUR_GIB + P - 1
    base = m.allocate_contiguous(3 * P, 0, highest, boundary)
    assert base is not None
    assert base // boundary == (base + 3 * P - 1) // boundary
    assert base == FOUR_GIB - 3 * P
    # A non-page-multiple boundary is honoured too.
    odd = 5 * P + 123
    base = m.allocate_contiguous(2 * P, 0, 0x10000000 - 1, odd)
    assert base is not None and base % P == 0
    assert base // odd == (base + 2 * P - 1) // odd


@pytest.mark.parametrize(("nbytes", "lowest", "highest", "boundary"), [
    (3 * P, 0, FOUR_GIB - 1, 2 * P),               # bigger than the boundary
    (4 * P, 0x200000, 0x200000 + 2 * P - 1, 0),    # range smaller than the block
    (P, 0x300000, 0x200000, 0),                    # lowest above highest
    (P, 0, 0xFFFFF, 0),                            # only the reserved first MiB
    (P, 7 << 30, 8 << 30, 0),                      # no memory there
])
def test_impossible_contiguous_requests_return_none(nbytes: int, lowest: int, highest: int,
                                                    boundary: int) -> None:
    m = PhysicalMemory()
    assert m.allocate_contiguous(nbytes, lowest, highest, boundary) is None
    assert m.extents() == [(m.start, m.end)]


def test_contiguous_needs_one_free_run_not_just_enough_pages() -> None:
    m = small(8)
    for _ in range(8):
        m.allocate_pages(1)
    for i in (0, 2, 4, 6):
        m.free_run(m.start + i * P, P)
    assert m.free_bytes == 4 * P
    assert m.allocate_contiguous(2 * P, 0, m.end - 1) is None
    assert m.allocate_contiguous(P, 0, m.end - 1) == m.start + 6 * P


def test_contiguous_refuses_nonsense() -> None:
    m = small()
    with pytest.raises(ValueError):
        m.allocate_contiguous(0, 0, m.end)
    with pytest.raises(ValueError):
        m.allocate_contiguous(P, 0, m.end, -P)


# -- a random walk against a per-page model -----------------------------------------------------


class MemoryWalk(RuleBasedStateMachine):
    """Random allocate/contiguous/free sequences on a small map with a 4 GiB-like line."""

    PAGES = 48
    LINE = RESERVED_BELOW + 24 * P  # stands for the 4 GiB line in this small map

    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.m = PhysicalMemory(size=RESERVED_BELOW + self.PAGES * P)
        self.used: dict[int, int] = {}  # page address -> allocation serial
        self.serial = 0

    def _claim(self, runs: list[Run]) -> list[Run]:
        self.serial += 1
        for address, nbytes in runs:
            assert address % P == 0 and nbytes % P == 0 and nbytes > 0
            for page in range(address, address + nbytes, P):
                assert page not in self.used, f"page {page:#x} handed out twice"
                self.used[page] = self.serial
        return runs

    def _free_pages(self, above: int = 0) -> int:
        return sum(1 for page in range(max(self.m.start, above), self.m.end, P) if page not in self.used)

    @rule(target=held, npages=st.integers(1, 12), high=st.booleans())
    def allocate(self, npages: int, high: bool) -> list[Run]:
        floor = self.LINE if high else 0
        expect_ok = self._free_pages(floor) >= npages
        runs = self.m.allocate_pages(npages, min_address=floor)
        assert (runs is not None) == expect_ok
        if runs is None:
            return []
        assert runs == sorted(runs)
        assert sum(n for _, n in runs) == npages * P
        assert all(a >= floor for a, _ in runs)
        return self._claim(runs)

    @rule(target=held, npages=st.integers(1, 6), lowest=st.integers(0, 60), span=st.integers(0, 60),
          boundary=st.sampled_from([0, 2, 4, 8]))
    def contiguous(self, npages: int, lowest: int, span: int, boundary: int) -> list[Run]:
        lo = RESERVED_BELOW + (lowest - 8) * P + 17  # sometimes below the map, unaligned
        hi = lo + span * P
        base = self.m.allocate_contiguous(npages * P, lo, hi, boundary * P)
        if base is None:
            return []
        size = npages * P
        assert base % P == 0 and base >= lo and base + size - 1 <= hi
        if boundary:
            assert base // (boundary * P) == (base + size - 1) // (boundary * P)
        return self._claim([(base, size)])

    @rule(runs=consumes(held))
    def free(self, runs: list[Run]) -> None:
        self.m.free(runs)
        for address, nbytes in runs:
            for page in range(address, address + nbytes, P):
                del self.used[page]

    @rule(runs=held)
    def double_free_is_refused(self, runs: list[Run]) -> None:
        if not runs:
            return
        before = self.m.extents()
        # Freeing something still held is fine only once; freeing a free page never is.
        free_pages = [p for p in range(self.m.start, self.m.end, P) if p not in self.used]
        if free_pages:
            with pytest.raises(ValueError):
                self.m.free([*runs, (free_pages[0], P)])
            assert self.m.extents() == before

    @invariant()
    def extents_match_the_model(self) -> None:
        extents = self.m.extents()
        for (_, e1), (s2, _) in itertools.pairwise(extents):
            assert e1 < s2, "extents overlap or were not merged"
        free: set[int] = set()
        for s, e in extents:
            assert self.m.start <= s < e <= self.m.end and s % P == 0 and e % P == 0
            free.update(range(s, e, P))
        assert free == {p for p in range(self.m.start, self.m.end, P) if p not in self.used}
        assert self.m.free_bytes == len(free) * P


TestMemoryWalk = MemoryWalk.TestCase
TestMemoryWalk.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
