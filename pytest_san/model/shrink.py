"""A small delta-debugging shrinker (Zeller's ddmin, complements only) for failing step sequences.

Steps depend on earlier ones (a transfer uses a handle a register step made), so dropping chunks of
the sequence and keeping what still fails finds the few steps that matter; a step that names
something a dropped step made is skipped on replay. Every try is a replay on the backend, so the
number of tries is bounded (``budget``) and so is the time (``until``, a ``time.monotonic`` value).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def shrink(items: Sequence[T], fails: Callable[[list[T]], bool], *, budget: int,
           until: float | None = None) -> list[T]:
    """A sub-sequence of ``items`` for which ``fails`` still holds, 1-minimal if the budget allows."""
    current = list(items)
    parts = 2
    tries = 0
    while len(current) >= 2:
        size = -(-len(current) // parts)  # ceil
        chunks = [(i, min(i + size, len(current))) for i in range(0, len(current), size)]
        for start, end in chunks:
            if tries >= budget or (until is not None and time.monotonic() > until and tries >= 3):
                return current
            tries += 1
            candidate = current[:start] + current[end:]
            if candidate and fails(candidate):
                current = candidate
                parts = max(parts - 1, 2)
                break
        else:
            if parts >= len(current):
                return current
            parts = min(parts * 2, len(current))
    return current
