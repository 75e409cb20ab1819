"""Hooks pytest-san offers to conftest.py files and other plugins.

Registered through ``pytest_addhooks``. Implement them in a conftest.py or plugin, e.g.::

    def pytest_san_make_provider(config, node, provider):
        return TracingProvider(provider)   # wrap the emulator's provider on every node
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import pytest_san.spi.protocols

    from ..deviations import Deviation
    from ..spi.protocols import Backend, Node, Provider, Proxy


@pytest.hookspec(firstresult=True)
def pytest_san_make_backend(config: pytest.Config, name: str) -> Backend | None:
    """Build the backend named by ``--san-backend`` (ini ``san_backend``).

    Called once per session, when the first test needs the backend. Return a backend to use it;
    return None to leave ``name`` to other implementations. pytest-san's own implementation runs
    last, builds ``"emulator"`` and raises ``pytest.UsageError`` for any name nobody built.

    A plugin that builds a backend should also implement :func:`pytest_san_backend_names`, so
    that ``--san-backend`` accepts the name before the session starts.
    """
    return None


@pytest.hookspec
def pytest_san_backend_names(config: pytest.Config) -> Iterable[str]:
    """Backend names this plugin can build (collected from every implementation).

    pytest-san's own implementation gives ``["emulator"]``; a lab plugin adds e.g. ``["hil"]``.
    An unknown ``--san-backend`` is a usage error listing the names from all implementations.
    """
    return ()


@pytest.hookspec(firstresult=True)
def pytest_san_make_provider(config: pytest.Config, node: Node, provider: Provider) -> Provider | None:
    """Return the provider to use on ``node`` instead of the default ``provider``.

    Wrap it (tracing, fault injection) or replace it (a provider under test). None keeps
    ``provider``. On the emulator this runs once per node while the backend is built, after
    :func:`pytest_san_make_proxy`, and the default provider already drives the chosen proxy. On
    ``hil`` it wraps the controller's stand-in for the host's provider (each time an agent starts).
    """
    return None


@pytest.hookspec(firstresult=True)
def pytest_san_make_proxy(config: pytest.Config, node: Node, proxy: Proxy) -> Proxy | None:
    """Return the proxy driver to use on ``node`` instead of the default ``proxy``.

    None keeps ``proxy``. Runs once per node while the backend is built, before the provider
    is made over it.
    """
    return None


@pytest.hookspec(firstresult=True)
def pytest_san_make_switch(config: pytest.Config, backend: Backend) -> pytest_san.spi.protocols.Switch | None:
    """Return the switch under test (``san_switch``) over ``backend``, in place of pytest-san's own.

    Called once per test that uses ``san_switch``. The switch must keep ``pytest_san.spi.protocols.Switch`` (what
    the scenarios call: ``connect``, ``close_all``, and the connections and endpoints it returns); it drives
    each node's provider (``process.node.provider``, as the provider hooks made it). None leaves the choice to
    other implementations; when none returns one, pytest-san's own ``pytest_san.switch.Switch`` is used. The
    fixture closes every connection it made after the test (``close_all``), before the leak check.
    """
    return None


@pytest.hookspec
def pytest_san_conformance(config: pytest.Config, report: dict[str, Any]) -> None:
    """Called with the final conformance report just before ``--san-report`` writes it.

    ``report`` is ``{"backend", "capabilities", "rules", "tests"}`` as written; change or add
    keys in place (a downstream project's own results, the lab inventory, ...). Under
    pytest-xdist it is called once, in the controller, with every worker's results merged.
    """


@pytest.hookspec
def pytest_san_node_capabilities(config: pytest.Config, node: Node, capabilities: set[str]) -> None:
    """Add or discard names of ``capabilities``, what ``node`` can do, in place.

    Called once per node and provider (again when a hil agent is replaced), after pytest-san derived the set
    from the backend, ``provider.supports_rdma_read`` and the optional ``san_capabilities`` mappings of the
    provider and proxy. ``san_requires`` skips a test unless every node it uses has what it names; the
    report's ``capabilities`` are what every node has, ``node_capabilities`` each node's own.
    """



@pytest.hookspec
def pytest_san_deviations(config: pytest.Config, backend: Backend) -> Iterable[Deviation] | None:
    """The deviations the implementations under test declare: each a ``pytest_san.Deviation`` naming the rule,
    the implementation, what differs, why (``by-design``, ``kernel-bug`` with its reproducer,
    ``spec-ambiguity``) and the tests it explains.

    Called once, when the backend is built; every implementation's lists are joined (a backend, provider, proxy
    or switch may instead have a ``deviations()`` method: ``pytest_san.deviations.DeclaresDeviations``). A
    test of the rule that fails as declared counts as ``deviating``, not failed (pytest shows it xfailed); one
    that passes fails as a strict xfail would, and the report says the deviation was not observed.
    """
