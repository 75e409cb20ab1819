"""The mutation corpus: planted bugs and legal variants that measure the conformance suite's power.

Each module of ``pytest_san.mutants.bugs`` is a provider or proxy with one realistic bug, plugged in like any
provider under test, through pytest-san's hooks::

    pytest --pyargs pytest_san.scenarios -p pytest_san.mutants.bugs.read_descriptor_writable

Its ``BREAKS`` names the rules the bug breaks, its docstring why the bug is realistic, and ``NEEDS`` (if any)
the capabilities without which the bug cannot show at all (a recoded out-of-memory error needs fault
injection to be provoked). Each module of ``pytest_san.mutants.legal`` is a variant the contract allows
(``BREAKS`` is empty): the suite must pass it. ``san-hil mutants`` runs the suite against every entry
(``pytest_san.mutants.runner``) and prints the kill matrix; with ``--plugin`` it runs an author's own modules,
declared the same way (``pytest_san.mutants.plugins``).

Every entry wraps the provider or proxy it is given and uses only the public protocols
(``pytest_san.mutants.wrapping``), so the same corpus runs on the emulator and on lab hosts.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from types import ModuleType

from ..report import RULE_IDS

KINDS = ("bugs", "legal")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry of the corpus."""

    name: str  # the module's own name, unique across the corpus
    module: str  # what ``-p`` loads
    legal: bool
    breaks: tuple[str, ...]  # rule ids (empty for a legal variant)
    needs: tuple[str, ...]  # capabilities without which the bug cannot show
    summary: str  # the docstring's first line
    path: str | None = None  # where an author's plugin is imported from (``plugins``); None: the package's own


def _entry(kind: str, module: ModuleType) -> Entry:
    name = module.__name__.rpartition(".")[2]
    breaks = tuple(getattr(module, "BREAKS", ()))
    needs = tuple(getattr(module, "NEEDS", ()))
    legal = kind == "legal"
    unknown = [rule for rule in breaks if rule not in RULE_IDS]
    if unknown or (legal and breaks) or (not legal and not breaks):
        raise ValueError(f"{module.__name__}: BREAKS must name known rules of a bug (none of a legal variant), "
                         f"got {breaks!r}")
    summary = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else ""
    return Entry(name, module.__name__, legal, breaks, needs, summary)


def corpus() -> list[Entry]:
    """Every entry, bugs first, each kind by name."""
    found: list[Entry] = []
    for kind in KINDS:
        package = importlib.import_module(f"{__name__}.{kind}")
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            if not info.name.startswith("_"):
                found.append(_entry(kind, importlib.import_module(f"{package.__name__}.{info.name}")))
    return found


def select(names: list[str] | None, entries: list[Entry] | None = None,
           where: str = "in the mutation corpus") -> list[Entry]:
    """The entries named (all when ``names`` is None) among ``entries`` (the corpus when None), each by its
    name (an author's plugin also by its module); a ValueError naming any unknown one."""
    entries = corpus() if entries is None else entries
    if names is None:
        return entries
    by_name = {e.name: e for e in entries} | {e.module: e for e in entries if e.path is not None}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"no such entry {where}: {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(e.name for e in entries))})")
    return list({id(e): e for e in (by_name[n] for n in names)}.values())


__all__ = ["Entry", "corpus", "select"]
