"""Every known difference shipped with pytest-san, as one table (docs/deviations.md).

Three sources: the deviations implementations declare (``pytest_san.Deviation``), the kernel workarounds of
the verbs engine (hil/agent/engines/verbs/quirks.py, turned into rows by hil/controller/workarounds.py: this
package never imports hil) and the reference model's documented alternatives (pytest_san/model/alternatives.py),
turned into rows here. ``markdown_table`` renders them; tests/pytest_san/test_known_differences.py holds the
docs' table to it.

Importing this module imports the model (about 0.3 s): the plugin does so only once the model ran.
"""

from __future__ import annotations

from collections.abc import Iterable

from .deviations import Deviation
from .model.alternatives import ALTERNATIVES, Alternative

__all__ = ["alternative", "alternatives_in_effect", "markdown_table"]


def alternative(alt: Alternative) -> Deviation:
    """``alt`` as a row of the table (its rule, why and reproducer are its own fields)."""
    which = "any backend" if alt.capability is None else f"a backend with `{alt.capability}`"
    which += f" without `{alt.unless}`" if alt.unless else ""
    return Deviation.known("alternative", alt.id, alt.rule, which, f"{alt.case} (the emulator: {alt.emulator})",
                           alt.accepted, alt.why, alt.reproducer, alt.because)


def alternatives_in_effect(capabilities: Iterable[str]) -> list[Deviation]:
    """The alternatives the model takes on a backend whose every node has ``capabilities``."""
    caps = frozenset(capabilities)
    return [alternative(alt) for alt in ALTERNATIVES if alt.applies(caps)]


def _cell(text: str | None) -> str:
    return "" if not text else text.replace("|", "\\|").replace("\n", " ")


def _code(command: str | None) -> str:
    return f"`{command}`" if command else ""


def markdown_table(declared: Iterable[Deviation], workarounds: Iterable[Deviation],
                   alternatives: Iterable[Deviation] | None = None) -> list[str]:
    """docs/deviations.md's table, one line per row: the declared deviations, then the workarounds, then the
    alternatives (``alternatives`` defaults to every one the model documents)."""
    lines = ["| kind | rule | name (or the tests) | who | what differs | instead | why | reproducer |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    every = [alternative(alt) for alt in ALTERNATIVES] if alternatives is None else list(alternatives)
    for entry in [*declared, *workarounds, *every]:
        named = f"`{entry.name}`" if entry.name else ", ".join(f"`{t}`" for t in entry.tests)
        why = entry.why + (f": {entry.because}" if entry.because else "")
        lines.append(f"| {entry.kind} | {entry.rule} | {_cell(named)} | {_cell(entry.implementation)} "
                     f"| {_cell(entry.what)} | {_cell(entry.instead)} | {_cell(why)} | {_code(entry.reproducer)} |")
    return lines
