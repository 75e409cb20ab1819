"""Shared setup for pytest-san's own tests."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    # The plugin is found through its pytest11 entry point: the package must be installed.
    if not config.pluginmanager.hasplugin("san"):
        raise pytest.UsageError("pytest-san is not installed in this environment: pip install -e '.[test]'")
