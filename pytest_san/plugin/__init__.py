"""pytest-san's pytest plugin (the ``pytest11`` entry point ``san``).

This module only wires the parts together: ``hookspecs`` declares the hooks other plugins may
implement, ``options`` the command line and ini keys, ``backends`` finds backends other packages
provide by name, ``hooks`` holds markers, capability skips and the conformance report, ``selection`` which tests run
(``--san-rules``, ``--san-sample``),
``fixtures`` holds ``san_backend``, ``san_switch``, ``san_provider``, ``san_proxy`` and the leak check;
``model`` runs the reference model for the suite (and for ``pytest_san.model``), ``html_report`` and ``junit``
put the rules into pytest-html's report and the JUnit XML, ``deviations`` turns a failure that an implementation
declared (a ``pytest_san.Deviation``) into a deviating one, ``bytes_diff`` explains a failed ``==`` of long byte
strings in linear time.
"""

from __future__ import annotations

import pytest

from . import hookspecs

# Registered under their module names, so ``-p no:pytest_san.plugin.fixtures`` works as usual.
pytest_plugins = ["pytest_san.plugin.options", "pytest_san.plugin.hooks", "pytest_san.plugin.selection",
                  "pytest_san.plugin.fixtures",
                  "pytest_san.plugin.model", "pytest_san.plugin.html_report", "pytest_san.plugin.deviations",
                  "pytest_san.plugin.junit",  # junit imports deviations: registered first, it is rewritten
                  "pytest_san.plugin.bytes_diff"]


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)
