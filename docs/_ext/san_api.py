"""The API reference's generated part: every name of ``pytest_san.__all__``, under the name users import.

``.. san-public-names::`` documents each class of ``pytest_san.__all__`` with autodoc and each constant or type
alias (``PAGE_SIZE``, ``Handle = int``) as data, its value and the ``#:`` comment or docstring its defining
module gives it; ``|exported protocols|`` in a page becomes the protocols listed there, so that
``pytest_san.spi.protocols``' own section can leave them out.
"""

from __future__ import annotations

import inspect
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

import pytest_san

DEFINING_MODULES = ("pytest_san.spi.contract", "pytest_san.spi.protocols")


def _is_defined_class(name: str, value: object) -> bool:
    """A class defined under this name (``Access``), not an alias of a builtin (``Handle = int``)."""
    return inspect.isclass(value) and value.__name__ == name and value.__module__.startswith("pytest_san.")


def _attribute_doc(name: str) -> list[str]:
    for module in DEFINING_MODULES:
        docs = ModuleAnalyzer.for_module(module).find_attr_docs()
        if ("", name) in docs:
            return [line for line in docs["", name] if line is not None]
    raise LookupError(f"pytest_san.{name}: no docstring or #: comment in {', '.join(DEFINING_MODULES)}")


def _value(value: Any) -> str:
    return value.__name__ if inspect.isclass(value) else repr(value)


class PublicNames(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        lines: list[str] = []
        for name in sorted(pytest_san.__all__):
            value = getattr(pytest_san, name)
            if _is_defined_class(name, value):
                kind = "autoexception" if issubclass(value, BaseException) else "autoclass"
                lines += [f".. {kind}:: pytest_san.{name}", "   :members:", "   :undoc-members:", ""]
            else:
                lines += [f".. py:data:: {name}", "   :module: pytest_san", f"   :value: {_value(value)}", ""]
                lines += [f"   {line}" if line else "" for line in _attribute_doc(name)] + [""]
        container = nodes.section()
        self.state.nested_parse(StringList(lines, source="pytest_san.__all__"), self.content_offset, container)
        return container.children


def exported_protocols() -> list[str]:
    import pytest_san.spi.protocols as protocols

    return sorted(name for name in pytest_san.__all__ if getattr(protocols, name, None) is getattr(pytest_san, name))


def _fill_in(app: Sphinx, docname: str, source: list[str]) -> None:
    source[0] = source[0].replace("|exported protocols|", ", ".join(exported_protocols()))


def _no_protocol_signature(app: Sphinx, what: str, name: str, obj: Any, options: Any, signature: str | None,
                           return_annotation: str | None) -> tuple[str, str | None] | None:
    """A protocol is implemented, never instantiated: its ``(*args, **kwargs)`` says nothing."""
    if what == "class" and getattr(obj, "_is_protocol", False):
        return "", return_annotation
    return None


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("san-public-names", PublicNames)
    app.connect("autodoc-process-signature", _no_protocol_signature)
    app.connect("source-read", _fill_in)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
