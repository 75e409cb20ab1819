"""The hil backend's pytest plugin: the only part of hil/ that imports pytest.

pytest-san imports it (entry point ``pytest_san.backends: hil``) once ``--san-backend=hil`` is chosen;
its options live in pytest-san's own ``san`` group. ``hooks`` builds the backend from the inventory and
attaches host diagnostics to failed tests, ``xdist`` leases hosts per worker and merges the lease
records, ``diagnostics`` collects a host's state, ``kernel`` puts each host's kernel and the kernel's record of
its RDMA resources into the report, ``nightly`` is what ``san-hil nightly`` adds to its runs.

PYTEST_DONT_REWRITE: this package module holds no assertions, and it is often imported before pytest-san
registers it as the backend's plugin -- as the package of ``-p hil.plugin.nightly``, which pytest imports
first -- so marking it for assertion rewriting then would only warn "Module already imported so cannot be
rewritten". Its modules (``hooks``, ``xdist``, ...) are rewritten as any plugin's.
"""

from __future__ import annotations

pytest_plugins = ["hil.plugin.hooks", "hil.plugin.xdist", "hil.plugin.kernel"]
