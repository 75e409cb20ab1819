"""The hil backend's pytest plugin: the only part of hil/ that imports pytest.

pytest-san imports it (entry point ``pytest_san.backends: hil``) once ``--san-backend=hil`` is chosen;
its options live in pytest-san's own ``san`` group. ``hooks`` builds the backend from the inventory and
attaches host diagnostics to failed tests, ``xdist`` leases hosts per worker and merges the lease
records, ``diagnostics`` collects a host's state, ``nightly`` is what ``san-hil nightly`` adds to its runs.
"""

from __future__ import annotations

pytest_plugins = ["hil.plugin.hooks", "hil.plugin.xdist"]
