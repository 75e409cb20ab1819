"""Backends other packages provide, found by name in the ``pytest_san.backends`` entry-point group.

An entry point names a pytest plugin module (``hil = "hil.plugin"``). Nothing is imported until
``--san-backend`` names it: then the module is registered as a plugin before anything is configured,
and builds the backend through ``pytest_san_make_backend``. A project that has its own package of the
same name, or lacks a backend's dependencies, is unaffected unless it selects that backend.
"""

from __future__ import annotations

import re
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
        extra = _extra_providing(ep, cause)
        if extra is not None and ep.dist is not None:
            raise pytest.UsageError(f"--san-backend={name} needs the {extra} extra: "
                                    f"pip install '{ep.dist.name}[{extra}]' ({why})") from None
        raise pytest.UsageError(f"--san-backend={name}: its plugin {ep.module}{dist} cannot be imported: "
                                f"{why}") from None


# import name -> distribution name, where they differ
_DISTRIBUTION_OF = {"yaml": "pyyaml"}


def _extra_providing(ep: EntryPoint, cause: BaseException) -> str | None:
    """The extra of the entry point's distribution that requires the module whose import failed."""
    if not isinstance(cause, ImportError) or not cause.name or ep.dist is None:
        return None
    top = cause.name.partition(".")[0]
    wanted = _DISTRIBUTION_OF.get(top, top).lower().replace("_", "-")
    for requirement in ep.dist.requires or []:
        found = re.match(r"\s*([A-Za-z0-9._-]+)[^;]*;.*\bextra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if found and found.group(1).lower().replace("_", "-") == wanted:
            return found.group(2)
    return None
