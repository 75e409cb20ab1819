"""The table of pytest options and ini keys, from the plugin's own ``pytest_addoption``, never kept by hand.

``.. san-options::`` calls a plugin module's ``pytest_addoption`` (default ``pytest_san.plugin.options``) with a
parser that only records, and renders one row per option: the option with its metavar or choices, the ini key of
the same name, the default and the help text. Arguments name the options to show (all of them when none);
``:module:`` names another plugin module. An option named that the module does not add fails the build.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

_NOTSET = object()


@dataclass
class Recorder:
    """Stands in for ``pytest.Parser`` and its groups: keeps what ``pytest_addoption`` declares."""

    options: list[tuple[tuple[str, ...], dict[str, Any]]] = field(default_factory=list)
    inis: dict[str, tuple[str, Any]] = field(default_factory=dict)

    def getgroup(self, name: str, description: str = "", after: str | None = None) -> Recorder:
        return self

    def addoption(self, *names: str, **attrs: Any) -> None:
        self.options.append((names, attrs))

    def addini(self, name: str, help: str, type: str | None = None, default: Any = _NOTSET) -> None:
        self.inis[name] = (help, default)


def record(module: str) -> Recorder:
    recorder = Recorder()
    importlib.import_module(module).pytest_addoption(recorder)
    return recorder


def _usage(names: tuple[str, ...], attrs: dict[str, Any]) -> str:
    if attrs.get("action") in ("store_true", "store_false"):
        return ", ".join(names)
    if attrs.get("choices"):
        value = "{" + ",".join(map(str, attrs["choices"])) + "}"
    else:
        value = attrs.get("metavar") or names[-1].lstrip("-").upper().replace("-", "_")
    return ", ".join(f"{name} {value}" for name in names)


def _default(attrs: dict[str, Any], ini: tuple[str, Any] | None) -> str:
    for value in (attrs.get("default"), ini[1] if ini else _NOTSET):
        if value not in (None, _NOTSET, "", False):
            return repr(value) if isinstance(value, str) else str(value)
    return ""


def rows(module: str, only: list[str] | None = None) -> list[tuple[str, str, str, str]]:
    """(option, ini key, default, help) per option, in the order the module adds them."""
    recorder = record(module)
    by_name = {names[-1]: (names, attrs) for names, attrs in recorder.options}
    unknown = [name for name in only or [] if name not in by_name]
    if unknown:
        raise ValueError(f"{module} adds no option {', '.join(unknown)}")
    out = []
    for name in only or list(by_name):
        names, attrs = by_name[name]
        key = name.lstrip("-").replace("-", "_")
        ini = recorder.inis.get(key)
        out.append((_usage(names, attrs), key if ini else "", _default(attrs, ini), attrs.get("help", "")))
    keys = {name.lstrip("-").replace("-", "_") for name in by_name}
    if not only:
        out += [("", key, _default({}, ini), ini[0]) for key, ini in recorder.inis.items() if key not in keys]
    return out


def _cell(text: str, literal: bool = False) -> nodes.entry:
    entry = nodes.entry()
    if text:
        entry += nodes.paragraph("", "", nodes.literal(text, text) if literal else nodes.Text(text))
    return entry


class Options(SphinxDirective):
    optional_arguments = 100
    option_spec: ClassVar[dict[str, Any]] = {"module": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        module = self.options.get("module", "pytest_san.plugin.options")
        table = nodes.table(classes=["san-options"])
        group = nodes.tgroup(cols=4)
        table += group
        for width in (28, 16, 12, 44):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += nodes.row("", *(_cell(title) for title in ("option", "ini key", "default", "meaning")))
        body = nodes.tbody()
        for option, key, default, help_text in rows(module, list(self.arguments) or None):
            body += nodes.row("", _cell(option, True), _cell(key, True), _cell(default, True), _cell(help_text))
        group += head
        group += body
        return [table]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("san-options", Options)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
