"""Backends other packages provide, found by name in the ``pytest_san.backends`` entry-point group.

An entry point names a pytest plugin module (``hil = "hil.plugin"``). Nothing is imported until
``--san-backend`` names it: then the module is registered as a plugin before anything is configured,
and builds the backend through ``pytest_san_make_backend``. A project that has its own package of the
same name, or lacks a backend's dependencies, is unaffected unless it selects that backend.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import pytest

GROUP = "pytest_san.backends"


def backend_entry_points() -> dict[str, EntryPoint]:
    """name -> entry point, for every installed distribution's ``pytest_san.backends``."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load_backend_plugin(config: pytest.Config, name: str) -> None:
    """Import and register the plugin of backend ``name``, if an entry point provides it."""
    ep = backend_entry_points().get(name)
    if ep is None or config.pluginmanager.has_plugin(ep.module):
        return
    try:
        config.pluginmanager.import_plugin(ep.module)
    except Exception as exc:  # pytest wraps the ImportError (PluginImportFailure in pytest 9)
        cause = exc.__cause__ or exc
        why = str(cause) if isinstance(cause, ImportError) else f"{type(cause).__name__}: {cause}"
        dist = f" (from {ep.dist.name})" if ep.dist is not None else ""
        raise pytest.UsageError(f"--san-backend={name}: its plugin {ep.module}{dist} cannot be imported: "
                                f"{why}") from None
