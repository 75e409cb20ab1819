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
BUILD_FAILED_KEY = pytest.StashKey[str]()
"""Why the session's backend could not be built: reported once; the session stops after that test."""
REMEMBERED = " [remembered: building the backend failed so earlier in this session; it is not tried again]"
_MAX_LINES = 25  # of a failure's message (an agent's stderr follows its first line)


def make_backend(config: pytest.Config, name: str) -> object | None:
    """The backend ``pytest_san_make_backend`` builds, reported once if it cannot be built.

    A failure is one short error (its message, no traceback) on the test that needed the backend, and the
    session stops after that test (``session.shouldfail``; xdist stops the other workers): not one
    traceback per test, each building the backend again. A later try (another worker's first test) gets
    the same error, remembered.
    """
    failed = config.stash.get(BUILD_FAILED_KEY, None)
    if failed is not None:
        raise pytest.fail.Exception(failed + REMEMBERED, pytrace=False)
    try:
        made: object | None = config.hook.pytest_san_make_backend(config=config, name=name)
        return made
    except (pytest.skip.Exception, pytest.exit.Exception):
        raise
    except (Exception, pytest.fail.Exception) as exc:
        message = build_failure(name, exc)
        config.stash[BUILD_FAILED_KEY] = message
        session = config.pluginmanager.get_plugin("session")
        if session is not None and not session.shouldfail:
            session.shouldfail = f"san: the {name} backend could not be built: no SAN test can run (the error above)"
        raise pytest.fail.Exception(message, pytrace=False) from None


def build_failure(name: str, exc: BaseException) -> str:
    """``exc``'s message as the one error of a backend that could not be built: the builtin exceptions'
    class named (``ConnectionRefusedError: ...``), the lines cut to a screenful."""
    text = str(exc).strip() or repr(exc)
    if type(exc).__module__ == "builtins":
        text = f"{type(exc).__name__}: {text}"
    lines = text.splitlines()
    if len(lines) > _MAX_LINES:
        lines = [*lines[:_MAX_LINES], f"... ({len(lines) - _MAX_LINES} more lines)"]
    return f"san: the {name} backend could not be built: " + "\n".join(lines)


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
