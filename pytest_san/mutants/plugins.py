"""An author's own entries: plugin modules named on the command line (``san-hil mutants --plugin``).

A ``--plugin`` is a module name importable from the current directory or ``PYTHONPATH`` (``my_bug``,
``mybugs.first_entry``), a ``.py`` file, or a directory: every module in it whose name does not start with
``_`` (nor ``conftest``, which pytest loads by itself); a directory with an ``__init__.py`` is a package and
its modules are imported as ``package.module``. Each module is one entry, declared as the shipped corpus
declares them: ``BREAKS``, the rule ids the bug breaks (a tuple; a single string is one rule id; none, or no
``BREAKS`` at all: a legal variant the suite must pass), and optionally ``NEEDS``, the capabilities without
which the bug cannot show. Each module is imported here first, so a module that cannot be imported or
declares anything else is one error naming it.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from ..report import RULE_IDS
from . import Entry


class PluginError(ValueError):
    """A ``--plugin`` that is no usable entry: the message names it and the problem, on one line."""


@contextlib.contextmanager
def _importable_from(directory: Path) -> Iterator[None]:
    sys.path.insert(0, str(directory))
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(directory))


def _import(spec: str, name: str, directory: Path) -> ModuleType:
    with _importable_from(directory):
        try:
            return importlib.import_module(name)
        except (Exception, SystemExit) as exc:  # the author's code: any error is theirs to see, in one line
            why = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
            raise PluginError(f"--plugin {spec}: cannot import {name}: {why}") from None


def _modules(spec: str, cwd: Path) -> list[tuple[str, Path]]:
    """(module name, directory it is imported from) for each module ``spec`` stands for."""
    path = cwd / spec
    if path.is_dir():
        package = (path / "__init__.py").is_file() and path.resolve().name.isidentifier()
        found = sorted(info.name for info in pkgutil.iter_modules([str(path)])
                       if not info.name.startswith("_") and info.name != "conftest")
        if not found:
            raise PluginError(f"--plugin {spec}: a directory without modules (every *.py but _* and conftest.py "
                              f"is an entry)")
        if package:
            return [(f"{path.resolve().name}.{name}", path.resolve().parent) for name in found]
        return [(name, path.resolve()) for name in found]
    if spec.endswith(".py"):
        if not path.is_file():
            raise PluginError(f"--plugin {spec}: no such file")
        if not path.stem.isidentifier():
            raise PluginError(f"--plugin {spec}: {path.stem!r} is not a module name (letters, digits, _)")
        return [(path.stem, path.resolve().parent)]
    if not all(part.isidentifier() for part in spec.split(".")):
        raise PluginError(f"--plugin {spec}: not a module name, a .py file or a directory")
    return [(spec, cwd.resolve())]


def _rule_ids(spec: str, module: ModuleType) -> tuple[str, ...]:
    breaks = getattr(module, "BREAKS", ())
    if isinstance(breaks, str):  # BREAKS = ("R6") is a string: one rule id
        breaks = (breaks,)
    if not isinstance(breaks, tuple | list | set | frozenset):
        raise PluginError(f"--plugin {spec}: {module.__name__}.BREAKS must be a tuple of rule ids such as "
                          f"('R6',), got {breaks!r:.80}")
    unknown = [rule for rule in breaks if rule not in RULE_IDS]
    if unknown:
        raise PluginError(f"--plugin {spec}: {module.__name__}.BREAKS names {', '.join(map(repr, unknown))}, "
                          f"not rule ids (known: {', '.join(RULE_IDS)})")
    return tuple(sorted(dict.fromkeys(breaks), key=RULE_IDS.index))


def _needs(spec: str, module: ModuleType) -> tuple[str, ...]:
    needs = getattr(module, "NEEDS", ())
    if (isinstance(needs, str) or not isinstance(needs, tuple | list | set | frozenset)
            or not all(isinstance(cap, str) for cap in needs)):
        raise PluginError(f"--plugin {spec}: {module.__name__}.NEEDS must be a tuple of capability names such as "
                          f"('faults',), got {needs!r:.80}")
    return tuple(needs)


def _entry(spec: str, name: str, directory: Path) -> Entry:
    module = _import(spec, name, directory)
    where = getattr(module, "__file__", None)
    if spec != name and where is not None and directory not in Path(where).resolve().parents:
        raise PluginError(f"--plugin {spec}: importing {name} gives {where}, another module of that name")
    if not any(attr.startswith("pytest_") and callable(getattr(module, attr)) for attr in dir(module)):
        raise PluginError(f"--plugin {spec}: {name} is no pytest plugin: it defines no hook "
                          f"(pytest_san_make_provider, pytest_san_make_proxy, ...)")
    breaks = _rule_ids(spec, module)
    summary = (module.__doc__ or "").strip().splitlines()[0] if (module.__doc__ or "").strip() else ""
    return Entry(name.rpartition(".")[2], name, not breaks, breaks, _needs(spec, module), summary,
                 path=str(directory))


def plugin_entries(specs: Sequence[str], cwd: Path | None = None) -> list[Entry]:
    """The entries of ``specs`` (each a module name, a .py file or a directory), in the order given; a
    ``PluginError`` for the first that cannot be imported, is no plugin, or declares what is not a rule id."""
    base = Path.cwd() if cwd is None else cwd
    entries: dict[str, Entry] = {}
    for spec in specs:
        for name, directory in _modules(spec, base):
            entry = _entry(spec, name, directory)
            same = entries.get(entry.name)
            if same is not None and same.module != entry.module:
                raise PluginError(f"--plugin {spec}: two entries named {entry.name} ({same.module} and "
                                  f"{entry.module}): rename one")
            entries[entry.name] = entry
    return list(entries.values())


__all__ = ["PluginError", "plugin_entries"]
