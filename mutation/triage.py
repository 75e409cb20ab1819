"""mutation/survivors.md: every mutant that survived, triaged (its format, its parser, its writer).

One entry per mutant, under a heading naming its file::

    ## pytest_san/spi/emulator/proxy.py

    - `EmulatedProxy.allocate_pages` `3f2a9c1e` **equivalent**: why no provider can tell the difference.
      `n = size >> _SHIFT` -> `n = size << _SHIFT`
    - `EmulatedProxy.allocate_pages` `0b12cd34` **closed** by `test_proxy_shapes.py::test_page_count`.
      ...

The key is the function and a hash of the lines the mutation changes (``mutant_key``), not mutmut's number
for it: a number moves when the function gains a mutant, the lines do not. The indented line under an entry is
the change, for the reader; the parser ignores it. Statuses: *equivalent* (the entry says why), *open* (a
survivor a scenario could kill: the entry says what it would take; known, so the gate passes it, but it counts
as a survivor), *closed* (it names the scenario or model check that kills it now), *untriaged* (written by
``--write-untriaged``; the gate fails on it).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

STATUSES = ("equivalent", "open", "closed", "untriaged")

_HEADING = re.compile(r"^## (?P<path>\S+\.py)\s*$")
_ENTRY = re.compile(r"^- `(?P<function>[^`]+)` `(?P<hash>[0-9a-f]{8})` \*\*(?P<status>[a-z]+)\*\*(?P<text>.*)$")


@dataclass(frozen=True)
class Entry:
    path: str
    function: str
    hash: str
    status: str
    text: str  # the why (equivalent) or the closing check (closed), as written

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.function, self.hash)


def changed_lines(original: str, mutant: str) -> tuple[list[str], list[str]]:
    """The lines a mutant changes: (removed, added), stripped, without context."""
    removed: list[str] = []
    added: list[str] = []
    a, b = original.splitlines(), mutant.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            removed += [line.strip() for line in a[i1:i2]]
            added += [line.strip() for line in b[j1:j2]]
    return removed, added


def function_text(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> str:
    """A function's source as ast renders it, under ``name`` (mutmut's mangled names differ per mutant)."""
    renamed = ast.parse(ast.unparse(function)).body[0]
    assert isinstance(renamed, (ast.FunctionDef, ast.AsyncFunctionDef))
    renamed.name = name
    return ast.unparse(renamed)


def mutant_key(original: str, mutant: str) -> str:
    """Eight hex digits naming a mutant by the lines it changes (see the module's docstring)."""
    removed, added = changed_lines(original, mutant)
    text = "\n".join(["-" + line for line in removed] + ["+" + line for line in added])
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]


def change_summary(original: str, mutant: str, width: int = 100) -> str:
    """One line for a reader: ``old`` -> ``new`` (each shortened to ``width`` characters)."""
    removed, added = changed_lines(original, mutant)

    def short(lines: list[str]) -> str:
        text = " / ".join(lines) or "(nothing)"
        return text if len(text) <= width else text[: width - 3] + "..."

    return f"`{short(removed)}` -> `{short(added)}`".replace("``", "` `")


class TriageError(ValueError):
    """survivors.md is malformed: the message names the file and line."""


def parse(text: str, source: str = "mutation/survivors.md") -> dict[tuple[str, str, str], Entry]:
    """The entries of a survivors.md, by key. An entry outside a file's heading, an unknown status, an
    equivalent without a why, a closed entry naming no check, or a key given twice is a TriageError."""
    entries: dict[tuple[str, str, str], Entry] = {}
    path = None
    for number, line in enumerate(text.splitlines(), 1):
        heading = _HEADING.match(line)
        if heading:
            path = heading["path"]
            continue
        m = _ENTRY.match(line)
        if m is None:
            if line.startswith("- `") and path is not None:
                raise TriageError(f"{source}:{number}: not an entry (- `function` `hash` **status** ...): {line:.80}")
            continue
        where = f"{source}:{number}"
        if path is None:
            raise TriageError(f"{where}: an entry before any '## path.py' heading")
        status, rest = m["status"], m["text"].strip()
        if status not in STATUSES:
            raise TriageError(f"{where}: unknown status {status!r} (one of {', '.join(STATUSES)})")
        if status in ("equivalent", "open") and not rest.lstrip(":").strip():
            raise TriageError(f"{where}: an {status} mutant needs its why after the status")
        if status == "closed" and "`" not in rest:
            raise TriageError(f"{where}: a closed mutant names the scenario or model check that kills it, in `...`")
        entry = Entry(path, m["function"], m["hash"], status, rest.lstrip(":").strip())
        if entry.key in entries:
            raise TriageError(f"{where}: {entry.function} {entry.hash} is triaged twice")
        entries[entry.key] = entry
    return entries


def load(path: Path) -> dict[tuple[str, str, str], Entry]:
    if not path.exists():
        return {}
    return parse(path.read_text(encoding="utf-8"), str(path))


@dataclass(frozen=True)
class NewEntry:
    path: str
    function: str
    hash: str
    change: str


def add_untriaged(text: str, new: Iterable[NewEntry]) -> str:
    """``text`` (a survivors.md) with an *untriaged* entry for each of ``new``, under its file's heading (made
    at the end when missing)."""
    lines = text.splitlines()
    seen: set[tuple[str, str, str]] = set()
    for item in new:
        if (item.path, item.function, item.hash) in seen:
            continue  # two mutants that change the same lines the same way share one key, and one entry
        seen.add((item.path, item.function, item.hash))
        entry = [f"- `{item.function}` `{item.hash}` **untriaged**", f"  {item.change}"]
        heading = f"## {item.path}"
        if heading not in lines:
            lines += ["", heading, ""]
            lines += entry
            continue
        at = lines.index(heading) + 1
        while at < len(lines) and not lines[at].startswith("## "):
            at += 1
        while lines[at - 1] == "":
            at -= 1
        lines[at:at] = entry
    return "\n".join(lines) + "\n"
