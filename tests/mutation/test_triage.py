"""The triage file (mutation/triage.py), and the gate that holds every survivor to it (mutation/results.py)."""

from __future__ import annotations

import pytest

from mutation import results, triage
from mutation.results import Mutant
from mutation.triage import NewEntry, TriageError, add_untriaged, change_summary, mutant_key, parse

SURVIVORS = """# Surviving mutants

Some prose, with a list:

- not an entry, before any file

## pytest_san/spi/emulator/proxy.py

- `EmulatedProxy.allocate_pages` `3f2a9c1e` **equivalent**: the page count is rounded up either way.
  `n = size >> _SHIFT` -> `n = size << _SHIFT`
- `EmulatedProxy.free` `0b12cd34` **closed** by `test_proxy_shapes.py::test_free_twice`.

## pytest_san/spi/checks.py

- `burst` `aaaaaaaa` **untriaged**
- `burst` `bbbbbbbb` **open**: a burst of depth 2 with a bad second entry would kill it.
"""


def test_entries_are_read_by_file_function_and_hash() -> None:
    entries = parse(SURVIVORS)
    assert set(entries) == {("pytest_san/spi/emulator/proxy.py", "EmulatedProxy.allocate_pages", "3f2a9c1e"),
                            ("pytest_san/spi/emulator/proxy.py", "EmulatedProxy.free", "0b12cd34"),
                            ("pytest_san/spi/checks.py", "burst", "aaaaaaaa"),
                            ("pytest_san/spi/checks.py", "burst", "bbbbbbbb")}
    equivalent = entries[("pytest_san/spi/emulator/proxy.py", "EmulatedProxy.allocate_pages", "3f2a9c1e")]
    assert equivalent.status == "equivalent"
    assert equivalent.text == "the page count is rounded up either way."


@pytest.mark.parametrize(("bad", "message"), [
    ("- `f` `12345678` **killed**: x", "unknown status 'killed'"),
    ("- `f` `12345678` **equivalent**", "needs its why"),
    ("- `f` `12345678` **open**", "needs its why"),
    ("- `f` `12345678` **closed** by a scenario", "names the scenario or model check"),
    ("- `f` `1234` **equivalent**: short hash", "not an entry"),
])
def test_a_malformed_entry_is_an_error_naming_its_line(bad: str, message: str) -> None:
    text = SURVIVORS.replace("- `burst` `aaaaaaaa` **untriaged**", bad)
    with pytest.raises(TriageError, match=message) as info:
        parse(text, "survivors.md")
    assert "survivors.md:15:" in str(info.value)


def test_an_entry_given_twice_is_an_error() -> None:
    with pytest.raises(TriageError, match=r"survivors.md:17: burst aaaaaaaa is triaged twice"):
        parse(SURVIVORS + "- `burst` `aaaaaaaa` **equivalent**: again\n", "survivors.md")


def test_an_entry_needs_a_file_heading() -> None:
    with pytest.raises(TriageError, match=r"before any '## path\.py' heading"):
        parse("- `f` `12345678` **equivalent**: why\n")


def test_the_key_is_the_changed_lines_not_where_they_are() -> None:
    original = "def f(x):\n    a = 1\n    return x >> 12\n"
    mutant = original.replace(">>", "<<")
    moved = "def f(x):\n    b = 2\n    c = 3\n    return x >> 12\n"
    assert mutant_key(original, mutant) == mutant_key(moved, moved.replace(">>", "<<"))
    assert mutant_key(original, mutant) != mutant_key(original, original.replace("12", "13"))
    assert change_summary(original, mutant) == "`return x >> 12` -> `return x << 12`"


def test_untriaged_entries_go_under_their_files_heading() -> None:
    text = add_untriaged(SURVIVORS, [NewEntry("pytest_san/spi/emulator/proxy.py", "g", "bbbbbbbb", "`a` -> `b`"),
                                     NewEntry("pytest_san/switch/endpoint.py", "h", "cccccccc", "`c` -> `d`")])
    entries = parse(text)
    assert entries[("pytest_san/spi/emulator/proxy.py", "g", "bbbbbbbb")].status == "untriaged"
    assert entries[("pytest_san/switch/endpoint.py", "h", "cccccccc")].status == "untriaged"
    lines = text.splitlines()
    assert lines.index("- `g` `bbbbbbbb` **untriaged**") < lines.index("## pytest_san/spi/checks.py")


def test_two_mutants_with_one_key_get_one_entry() -> None:
    """Two mutants that change the same lines the same way share their key: one entry, which the parser takes
    (it refuses a key given twice). Found triaging the example switch (issue 37)."""
    same = NewEntry("pytest_san/switch/endpoint.py", "h", "cccccccc", "`c` -> `d`")
    entries = parse(add_untriaged(SURVIVORS, [same, same]))
    assert entries[("pytest_san/switch/endpoint.py", "h", "cccccccc")].status == "untriaged"


def mutant(function: str, key: str, status: str, message_only: bool = False,
           path: str = "pytest_san/spi/emulator/proxy.py") -> Mutant:
    return Mutant(f"m.{function}.{key}", path, function, status, message_only, key, "")


def test_the_gate_passes_triaged_survivors_and_fails_the_others() -> None:
    entries = parse(SURVIVORS)
    verdict = results.judge([
        mutant("EmulatedProxy.allocate_pages", "3f2a9c1e", results.SURVIVED),  # equivalent
        mutant("EmulatedProxy.free", "0b12cd34", results.KILLED),  # closed, and killed
        mutant("EmulatedProxy.free", "dddddddd", results.SURVIVED, message_only=True),  # not counted
        mutant("EmulatedProxy.free", "eeeeeeee", results.KILLED),
        mutant("EmulatedProxy.free", "ffffffff", results.NOT_RUN),
    ], entries)
    counts = verdict.by_file["pytest_san/spi/emulator/proxy.py"]
    assert (counts.mutants, counts.message_only, counts.killed, counts.survived, counts.equivalent,
            counts.untriaged, counts.not_run) == (5, 1, 2, 1, 1, 0, 1)
    assert not verdict.failed

    new = mutant("EmulatedProxy.free", "99999999", results.SURVIVED)
    assert results.judge([new], entries).untriaged == [new]
    reopened = results.judge([mutant("EmulatedProxy.free", "0b12cd34", results.SURVIVED)], entries)
    assert reopened.failed and reopened.reopened[0][1].text.startswith("by `test_proxy_shapes.py")
    untriaged_entry = results.judge([mutant("burst", "aaaaaaaa", results.SURVIVED, path="pytest_san/spi/checks.py")],
                                    entries)
    assert untriaged_entry.failed  # an *untriaged* entry does not pass the gate
    known = results.judge([mutant("burst", "bbbbbbbb", results.SURVIVED, path="pytest_san/spi/checks.py")], entries)
    assert not known.failed and known.by_file["pytest_san/spi/checks.py"].open == 1  # known, and counted


def test_an_equivalent_entry_no_survivor_matches_is_stale() -> None:
    entries = parse(SURVIVORS)
    verdict = results.judge([mutant("EmulatedProxy.allocate_pages", "3f2a9c1e", results.KILLED)], entries)
    assert [e.hash for e in verdict.stale] == ["3f2a9c1e"]


def test_mutmut_exit_codes() -> None:
    assert results.status_of(1) == results.KILLED
    assert results.status_of(-24) == results.KILLED  # a timeout
    assert results.status_of(0) == results.SURVIVED
    assert results.status_of(33) == results.SURVIVED  # no test reaches it
    assert results.status_of(None) == results.NOT_RUN
    assert results.status_of(2) == results.NOT_RUN  # interrupted
    assert triage.STATUSES == ("equivalent", "open", "closed", "untriaged")
