"""A failed ``==`` of long byte strings is explained in linear time, with the first differing offset.

Found by the fresh-clone CI run: the held-out switch bug rdma_remainder_dropped made
``test_every_length_arrives_once_in_order_both_ways`` fail an ``==`` of a transfer's bytes, and with ``CI=true``
(pytest then truncates nothing) pytest's difflib explanation of it ran for over 7 minutes.
"""

from __future__ import annotations

import pytest

from pytest_san.plugin.bytes_diff import explain, first_difference


@pytest.mark.parametrize(("left", "right", "at"), [
    (b"abc", b"abc", 3), (b"abc", b"abd", 2), (b"xbc", b"abc", 0), (b"ab", b"abc", 2), (b"", b"a", 0),
    (bytes(1000) + b"\1", bytes(1001), 1000),
])
def test_first_difference(left: bytes, right: bytes, at: int) -> None:
    assert first_difference(left, right) == at


def test_the_explanation_names_lengths_and_offset() -> None:
    lines = explain(bytes(range(256)) * 4, bytes(range(256)) * 3 + bytes(range(200)))
    assert lines[0] == "byte strings differ: left has 1024 bytes, right 968"
    assert lines[1] == "first difference at offset 968"
    assert lines[2].startswith("left[960:976] = c0 c1 c2 c3 c4 c5 c6 c7 c8")
    assert lines[3] == "right[960:976] = c0 c1 c2 c3 c4 c5 c6 c7"


def test_a_megabyte_that_lost_its_last_byte_fails_at_once_on_ci(pytester: pytest.Pytester,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")  # pytest truncates nothing on CI
    pytester.makepyfile("""
        import random

        def test_transfer():
            sent = random.Random(1).randbytes(1 << 20)
            got = bytearray(sent[:-1]) + b"?"
            assert got == sent
    """)
    result = pytester.runpytest_subprocess(timeout=120)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*byte strings differ: left has 1048576 bytes, right 1048576*",
                                 "*first difference at offset 1048575*"])


def test_short_byte_strings_keep_pytests_own_explanation(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        def test_short():
            assert b"abc" == b"abd"

        def test_long_text():
            assert "a" * 300 == "a" * 299 + "b"
    """)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=2)
    assert "byte strings differ" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*At index 2 diff*"])
