"""Every known difference shipped with pytest-san, as one table (docs/deviations.md).

Three sources: the deviations implementations declare (``pytest_san.Deviation``), the kernel workarounds of
the verbs engine (hil/agent/engines/verbs/quirks.py, turned into rows by hil/controller/workarounds.py: this
package never imports hil) and the reference model's documented alternatives (pytest_san/model/alternatives.py),
turned into rows here. ``markdown_table`` renders them; tests/pytest_san/test_known_differences.py holds the
docs' table to it.

Importing this module imports the model (about 0.3 s): the plugin does so only once the model ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .deviations import Deviation, KnownDifference, Why
from .model.alternatives import ALTERNATIVES, Alternative

__all__ = ["ALTERNATIVE_RULES", "alternative", "alternatives_in_effect", "markdown_table"]

ALTERNATIVE_RULES: Mapping[str, tuple[str, Why, str | None]] = {
    # id: the rule it bears on, why a backend answers so, and the lab reproducer of a kernel's behaviour
    "rc-queue-order": ("R14", "by-design", None),
    "send-wait-bounded": ("R14", "kernel-bug", "san-hil lab reproduce rxe-send-wait-bounded"),
    "local-error-breaks-local-end": ("R4", "by-design", None),
    "unknown-lkey-status": ("R14", "kernel-bug", "san-hil lab reproduce rxe-unknown-lkey-status"),
    "short-receive-status": ("R14", "kernel-bug", "san-hil lab reproduce rxe-short-receive-status"),
    "zero-byte-rdma": ("R3", "spec-ambiguity", None),
    "rdma-read-one-buffer": ("R14", "by-design", None),
    "error-ends-connection": ("R4", "by-design", None),
    "descriptor-checked-first": ("R14", "kernel-bug", "san-hil lab reproduce siw-unchecked-remote-access"),
    "refused-at-the-call": ("R14", "spec-ambiguity", None),
}
"""Each documented alternative's place in the table (tests/pytest_san/test_known_differences.py checks that
every alternative has one)."""


def alternative(alt: Alternative) -> KnownDifference:
    """``alt`` as a row of the table."""
    try:
        rule, why, reproducer = ALTERNATIVE_RULES[alt.id]
    except KeyError:
        raise KeyError(f"documented alternative {alt.id!r} has no row in pytest_san/known_differences.py's "
                       "ALTERNATIVE_RULES") from None
    which = "any backend" if alt.capability is None else f"a backend with `{alt.capability}`"
    which += f" without `{alt.unless}`" if alt.unless else ""
    return KnownDifference("alternative", alt.id, rule, which, f"{alt.case} (the emulator: {alt.emulator})",
                           alt.accepted, why, reproducer, alt.why)


def alternatives_in_effect(capabilities: Iterable[str]) -> list[KnownDifference]:
    """The alternatives the model takes on a backend whose every node has ``capabilities``."""
    caps = frozenset(capabilities)
    return [alternative(alt) for alt in ALTERNATIVES if alt.applies(caps)]


def _cell(text: str | None) -> str:
    return "" if not text else text.replace("|", "\\|").replace("\n", " ")


def _code(command: str | None) -> str:
    return f"`{command}`" if command else ""


def markdown_table(declared: Iterable[Deviation], workarounds: Iterable[KnownDifference],
                   alternatives: Iterable[KnownDifference] | None = None) -> list[str]:
    """docs/deviations.md's table, one line per row: the declared deviations, then the workarounds, then the
    alternatives (``alternatives`` defaults to every one the model documents)."""
    lines = ["| kind | rule | name (or the tests) | who | what differs | instead | why | reproducer |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for dev in declared:
        tests = ", ".join(f"`{t}`" for t in dev.tests)
        lines.append(f"| declared | {dev.rule} | {_cell(tests)} | {_cell(dev.implementation)} | {_cell(dev.what)} "
                     f"| | {dev.why} | {_code(dev.reproducer)} |")
    every = [alternative(alt) for alt in ALTERNATIVES] if alternatives is None else list(alternatives)
    for diff in [*workarounds, *every]:
        why = diff.why + (f": {diff.because}" if diff.because else "")
        lines.append(f"| {diff.kind} | {diff.rule} | `{diff.name}` | {_cell(diff.implementation)} | {_cell(diff.what)} "
                     f"| {_cell(diff.instead)} | {_cell(why)} | {_code(diff.reproducer)} |")
    return lines
