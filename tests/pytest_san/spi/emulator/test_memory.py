"""PhysicalMemory: a map of page frames; first-fit runs, top-down contiguous runs, checked frees."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from pytest_san import FOUR_GIB, PAGE_SIZE
from pytest_san.spi.emulator.memory import (
    DEFAULT_FRAMES,
    FOUR_GIB_FRAME,
    FREE,
    PAGE_SHIFT,
    RESERVED,
    RESERVED_FRAMES,
    TAKEN,
    PhysicalMemory,
)

P = PAGE_SIZE
R = RESERVED_FRAMES


def small(frames: int = 16) -> PhysicalMemory:
    """A memory of ``frames`` usable frames above the reserved first MiB."""
    return PhysicalMemory(R + frames)


def test_default_map_is_6_gib_with_the_first_mib_reserved() -> None:
    m = PhysicalMemory()
    assert m.frames == DEFAULT_FRAMES == (6 << 30) >> PAGE_SHIFT
    assert R == 0x100000 >> PAGE_SHIFT and FOUR_GIB_FRAME == FOUR_GIB >> PAGE_SHIFT
    assert m.frame_map == RESERVED * R + FREE * (m.frames - R)
    assert m.free_frames == m.frames - R
    assert m.frames > FOUR_GIB_FRAME  # there is memory on both sides of the 4 GiB line


def test_take_is_first_fit_from_the_bottom_and_frees_give_back() -> None:
    m = small()
    assert [m.take(1, 0) for _ in range(3)] == [R, R + 1, R + 2]
    m.free(R + 1, 1)
    assert m.take(2, 0) == R + 3  # the one-frame hole is too small for two
    assert m.take(1, 0) == R + 1  # ... but holds one
    assert m.take(1, R + 10) == R + 10  # at or above the floor
    assert m.frame_map[R:R + 6] == TAKEN * 5 + FREE
    for first, count in ((R, 3), (R + 3, 2), (R + 10, 1)):
        m.free(first, count)
    assert m.free_frames == 16


def test_take_returns_none_and_changes_nothing_when_no_run_fits() -> None:
    m = small(4)
    assert m.take(5, 0) is None
    assert m.take(1 << 40, 0) is None  # longer than the map: no huge search pattern is built
    assert m.take(1, R + 4) is None  # the floor is past the memory
    assert m.free_frames == 4
    assert m.take(4, 0) == R
    assert m.take(1, 0) is None


@pytest.mark.parametrize(("first", "count"), [
    (R + 2, 1),  # already free
    (R - 1, 1),  # reserved
    (R, 3),  # partly free
    (R + 16, 1),  # past the end
])
def test_bad_frees_raise_and_change_nothing(first: int, count: int) -> None:
    m = small()
    assert m.take(2, 0) == R
    before = m.frame_map
    with pytest.raises(ValueError, match="not all of them are taken"):
        m.free(first, count)
    assert m.frame_map == before


def test_double_free_is_refused() -> None:
    m = small()
    first = m.take(4, 0)
    assert first is not None
    m.free(first, 4)
    with pytest.raises(ValueError, match=f"{first:#x}"):
        m.free(first, 4)


# -- contiguous ---------------------------------------------------------------------------------


def test_contiguous_comes_from_the_top_of_the_range() -> None:
    m = PhysicalMemory()
    assert m.take_contiguous(3, 0, FOUR_GIB_FRAME, 0) == FOUR_GIB_FRAME - 3
    assert m.take_contiguous(1, 0, 1 << 40, 0) == m.frames - 1  # a high limit past the map
    assert m.take_contiguous(2, 0, FOUR_GIB_FRAME, 0) == FOUR_GIB_FRAME - 5  # below what is taken
    assert m.take_contiguous(1, R + 4, R + 5, 0) == R + 4  # an exact fit
    assert m.take_contiguous(2, R + 8, R + 9, 0) is None  # a range smaller than the run


def test_contiguous_never_crosses_a_boundary_multiple() -> None:
    m = PhysicalMemory()
    boundary = 16 * P
    # The range ends one frame past a multiple of the boundary: the top 3 frames would straddle it, so
    # the run moves down to end at the multiple.
    assert m.take_contiguous(3, 0, FOUR_GIB_FRAME + 1, boundary) == FOUR_GIB_FRAME - 3
    # A boundary that is no page multiple is honoured too.
    odd = 5 * P + 123
    first = m.take_contiguous(2, 0, 0x10000, odd)
    assert first is not None
    assert (first << PAGE_SHIFT) // odd == (((first + 2) << PAGE_SHIFT) - 1) // odd
    assert m.take_contiguous(17, 0, FOUR_GIB_FRAME, boundary) is None  # bigger than the boundary


def test_contiguous_needs_one_free_run_not_just_enough_frames() -> None:
    m = small(8)
    assert m.take(8, 0) == R
    for i in (0, 2, 4, 6):
        m.free(R + i, 1)
    assert m.free_frames == 4
    assert m.take_contiguous(2, 0, m.frames, 0) is None
    assert m.take(2, 0) is None
    assert m.take_contiguous(1, 0, m.frames, 0) == R + 6


# -- a random walk against a per-frame model ----------------------------------------------------


class MemoryWalk(RuleBasedStateMachine):
    """Random take/contiguous/free sequences on a small map with a 4 GiB-like line."""

    FRAMES = 48
    LINE = R + 24  # stands for the 4 GiB line in this small map

    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.m = PhysicalMemory(R + self.FRAMES)
        self.used: set[int] = set()

    def _claim(self, first: int, count: int) -> tuple[int, int]:
        for frame in range(first, first + count):
            assert R <= frame < self.m.frames and frame not in self.used, f"frame {frame:#x} handed out twice"
            self.used.add(frame)
        return first, count

    def _fits(self, count: int, low: int, high: int, boundary: int = 0) -> list[int]:
        return [f for f in range(max(low, R), min(high, self.m.frames) - count + 1)
                if not self.used & set(range(f, f + count))
                and (not boundary or (f * P) // boundary == ((f + count) * P - 1) // boundary)]

    @rule(target=held, count=st.integers(1, 12), high=st.booleans())
    def take(self, count: int, high: bool) -> tuple[int, int] | None:
        floor = self.LINE if high else 0
        fits = self._fits(count, floor, self.m.frames)
        first = self.m.take(count, floor)
        assert first == (fits[0] if fits else None)  # first fit
        return None if first is None else self._claim(first, count)

    @rule(target=held, count=st.integers(1, 6), low=st.integers(0, 60), span=st.integers(0, 60),
          boundary=st.sampled_from([0, 2 * P, 4 * P, 8 * P, 3 * P + 5]))
    def contiguous(self, count: int, low: int, span: int, boundary: int) -> tuple[int, int] | None:
        low, high = R + low - 8, R + low - 8 + span
        fits = self._fits(count, low, high, boundary)
        first = self.m.take_contiguous(count, max(low, 0), high, boundary)
        assert first == (fits[-1] if fits else None)  # the highest that fits
        return None if first is None else self._claim(first, count)

    @rule(run=consumes(held))
    def free(self, run: tuple[int, int] | None) -> None:
        if run is not None:
            self.m.free(*run)
            self.used -= set(range(run[0], run[0] + run[1]))

    @rule(run=held)
    def refused_free_changes_nothing(self, run: tuple[int, int] | None) -> None:
        free = [f for f in range(R, self.m.frames) if f not in self.used]
        if run is None or not free:
            return
        before = self.m.frame_map
        with pytest.raises(ValueError):
            self.m.free(free[0], 1)
        assert self.m.frame_map == before

    @invariant()
    def map_matches_the_model(self) -> None:
        expected = bytearray(RESERVED * R + FREE * self.FRAMES)
        for frame in self.used:
            expected[frame] = TAKEN[0]
        assert self.m.frame_map == bytes(expected)
        assert self.m.free_frames == self.FRAMES - len(self.used)


TestMemoryWalk = MemoryWalk.TestCase
TestMemoryWalk.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
