"""pytest-san's fixtures: the backend, a switch, the local provider and proxy, and the leak check."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ..report import LEAK_RULE
from .hooks import LEAKS_KEY, created_backend, get_backend, uses_san_fixtures

if TYPE_CHECKING:
    from ..protocols import Backend, Provider, Proxy
    from ..switch import Switch


@pytest.fixture(scope="session")
def san_backend(pytestconfig: pytest.Config) -> Backend:
    """The session's SAN backend (``--san-backend``), built on first use, closed at session end."""
    return get_backend(pytestconfig)


@pytest.fixture
def san_switch(san_backend: Backend) -> Iterator[Switch]:
    """A Windows Sockets switch over the backend; every connection it made is closed afterwards."""
    from ..switch import Switch  # imported late: loading the plugin stays cheap

    switch = Switch(san_backend)
    yield switch
    switch.close_all()


@pytest.fixture
def san_provider(san_backend: Backend) -> Provider:
    """The SAN provider of the backend's first node (the local endpoint's)."""
    return san_backend.nodes[0].provider


@pytest.fixture
def san_proxy(san_backend: Backend) -> Proxy:
    """The proxy driver of the backend's first node (the local endpoint's)."""
    return san_backend.nodes[0].proxy


def leak_message(leaks: list[str]) -> str:
    lines = [f"SAN leak ({LEAK_RULE}): {len(leaks)} registration(s) or allocation(s) still alive after "
             "the test's sockets were closed (backend reset for the next test):"]
    lines += [f"  {leak}" for leak in leaks]
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def _san_leak_check(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that used a SAN fixture: nothing may stay registered or allocated.

    Autouse fixtures are set up first and so torn down last: by now ``san_switch`` has closed
    the test's connections. Tests without SAN fixtures pay one set intersection.
    """
    if not uses_san_fixtures(request.fixturenames):
        yield
        return
    yield
    backend = created_backend(request.config)
    if backend is None:
        return
    try:
        leaks = [str(leak) for leak in backend.leaks()]
    finally:
        backend.reset()  # the next test starts clean: processes, links and faults too, leaked or not
    if leaks:
        request.node.stash[LEAKS_KEY] = leaks
        pytest.fail(leak_message(leaks), pytrace=False)
