"""A stand-in for pyverbs, so that autodoc imports the agent's verbs engine on a machine without it.

pyverbs exists only for a lab host's system python3. Sphinx's own ``autodoc_mock_imports`` will not do: the
engine's ``enums`` module reads each IBV_*/RDMA_* constant with ``int()``, which a mock object refuses. Here
every ``pyverbs.*`` module is made on first import: in its enum modules every name is the int 0, in the others
every name is an empty class (the engine subclasses and annotates with them; nothing is ever called).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

ENUM_MODULES = {"enums", "cm_enums", "libibverbs_enums", "librdmacm_enums"}


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if self.__name__.rpartition(".")[2] in ENUM_MODULES:
            return 0
        if self.__name__ == "pyverbs" and name in ENUM_MODULES:
            return sys.modules.get(f"pyverbs.{name}") or __import__(f"pyverbs.{name}", fromlist=["_"])
        value = type(name, (), {"__module__": self.__name__, "__doc__": f"pyverbs' {name} (a stand-in)"})
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "pyverbs" or name.startswith("pyverbs."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """First on sys.meta_path: the docs describe the engine the same way whether pyverbs is there or not."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
