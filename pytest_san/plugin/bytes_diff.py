"""A failed ``==`` of two long byte strings, explained in linear time.

The scenarios compare what arrived with what was sent, up to megabytes. pytest explains a failed ``==`` of two
sequences with difflib, which is quadratic, and on CI (``CI`` or ``BUILD_NUMBER`` set) it does not truncate: a
provider that loses one byte of a 1 MiB transfer kept such an explanation busy for minutes. This one says the
lengths, the first offset that differs and the bytes around it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import pytest
from _pytest.assertion import util  # the rewritten asserts' explainer: no public way to reach it

LONG = 256  # bytes: shorter ones keep pytest's own explanation
CONTEXT = 8  # bytes shown either side of the first difference

_Bytes = (bytes, bytearray, memoryview)


def first_difference(left: bytes, right: bytes) -> int:
    """The first offset where they differ (the shorter one's length when one is a prefix of the other)."""
    low, high = 0, min(len(left), len(right))
    while low < high:  # bisect on equal prefixes: each comparison is C-speed
        middle = (low + high + 1) // 2
        if left[:middle] == right[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def explain(left: bytes, right: bytes) -> list[str]:
    at = first_difference(left, right)
    start = max(0, at - CONTEXT)
    lines = [f"byte strings differ: left has {len(left)} bytes, right {len(right)}",
             f"first difference at offset {at}"]
    lines += [f"{name}[{start}:{at + CONTEXT}] = {side[start:at + CONTEXT].hex(' ')}"
              for name, side in (("left", left), ("right", right))]
    return lines


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Inside pytest's own wrapper, which installs the rewritten asserts' explainer (``util._reprcompare``) for
    the test: an ``==`` of long byte strings is answered here, before pytest's hooks run (every implementation
    of ``pytest_assertrepr_compare`` is called, its own difflib one included, so a hook cannot spare it)."""
    explainer: Callable[[str, object, object], str | None] | None = util._reprcompare
    if explainer is None:  # assertion rewriting is off
        return (yield)

    def reprcompare(op: str, left: object, right: object) -> str | None:
        if op == "==" and isinstance(left, _Bytes) and isinstance(right, _Bytes):
            a, b = bytes(left), bytes(right)
            if max(len(a), len(b)) >= LONG:
                return "\n~".join(explain(a, b))
        return explainer(op, left, right)

    util._reprcompare = reprcompare
    try:
        return (yield)
    finally:
        util._reprcompare = explainer
