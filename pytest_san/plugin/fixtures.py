"""pytest-san's fixtures: the backend, a switch, the local provider and proxy, and the leak check."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ..report import leak_rules
from ..spi.contract import SanError, WsaError
from ..spi.protocols import CountsRoundTrips, EndsTests
from .hooks import LEAKS_KEY, SAN_FIXTURES, created_backend, get_backend, uses_san_fixtures

if TYPE_CHECKING:
    from ..spi.protocols import Backend, Provider, Proxy, Switch

SWITCHES_KEY = pytest.StashKey[list["Switch"]]()
"""On an item: the switches its ``san_switch`` made, closed by the leak check when the backend ends tests itself."""
ROUND_TRIPS_KEY = pytest.StashKey[dict[str, dict[str, int]]]()
"""On an item: {"setup" | "teardown": {host: round trips}} the SAN fixtures cost (backends that count them)."""
ROUND_TRIPS_PROPERTY = "san_round_trips"
"""The same, in ``item.user_properties`` (and so in the junit XML and on the test's reports)."""


def round_trips(backend: object) -> dict[str, int] | None:
    """Per host, the agent round trips ``backend`` made so far, if it counts them (the hil backend)."""
    return dict(backend.round_trips()) if isinstance(backend, CountsRoundTrips) else None


def _add_round_trips(item: pytest.Item, phase: str, before: dict[str, int] | None, backend: object) -> None:
    after = round_trips(backend)
    if before is None or after is None:
        return
    empty: dict[str, dict[str, int]] = {"setup": {}, "teardown": {}}
    spent = item.stash.setdefault(ROUND_TRIPS_KEY, empty)[phase]
    for host, count in after.items():
        spent[host] = spent.get(host, 0) + count - before.get(host, 0)
    item.user_properties[:] = [p for p in item.user_properties if p[0] != ROUND_TRIPS_PROPERTY]
    item.user_properties.append((ROUND_TRIPS_PROPERTY, item.stash[ROUND_TRIPS_KEY]))


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[Any]:
    """Counts what setting up a SAN fixture costs in agent round trips (``san_backend``'s start excepted:
    it is once per session)."""
    if fixturedef.argname not in SAN_FIXTURES or fixturedef.argname == "san_backend":
        return (yield)
    backend = created_backend(request.config)
    before = round_trips(backend)
    try:
        return (yield)
    finally:
        _add_round_trips(request.node, "setup", before, backend)


@pytest.fixture(scope="session")
def san_backend(pytestconfig: pytest.Config) -> Backend:
    """The session's SAN backend (``--san-backend``), built on first use, closed at session end."""
    return get_backend(pytestconfig)


@pytest.fixture
def san_switch(san_backend: Backend, request: pytest.FixtureRequest) -> Iterator[Switch]:
    """A Windows Sockets switch over the backend: a plugin's (``pytest_san_make_switch``), else pytest-san's own;
    every connection it made is closed afterwards (by the leak check, in the same batch as the check and the
    reset, where the backend ends tests itself)."""
    switch = make_switch(request.config, san_backend)
    if isinstance(san_backend, EndsTests):
        request.node.stash.setdefault(SWITCHES_KEY, []).append(switch)
        yield switch
        return
    yield switch
    before = round_trips(san_backend)
    try:
        switch.close_all()
    finally:
        _add_round_trips(request.node, "teardown", before, san_backend)


def make_switch(config: pytest.Config, backend: Backend) -> Switch:
    """The switch under test: what ``pytest_san_make_switch`` returned, else ``pytest_san.switch.Switch``."""
    made: Switch | None = config.hook.pytest_san_make_switch(config=config, backend=backend)
    if made is not None:
        missing = [name for name in ("connect", "close_all") if not callable(getattr(made, name, None))]
        if missing:
            raise TypeError(f"pytest_san_make_switch returned {made!r:.80}, which is no switch: it lacks "
                                    f"{', '.join(missing)} (pytest_san.spi.protocols.Switch)")
        return made
    from ..switch import Switch as OwnSwitch  # imported late: loading the plugin stays cheap

    return OwnSwitch(backend)


@pytest.fixture
def san_provider(san_backend: Backend) -> Provider:
    """The SAN provider of the backend's first node (the local endpoint's)."""
    return san_backend.nodes[0].provider


@pytest.fixture
def san_proxy(san_backend: Backend) -> Proxy:
    """The proxy driver of the backend's first node (the local endpoint's)."""
    return san_backend.nodes[0].proxy


def leak_message(leaks: list[str]) -> str:
    lines = [f"SAN leak ({'/'.join(leak_rules(leaks))}): {len(leaks)} registration(s), allocation(s) or pin(s) "
             "still alive after the test's sockets were closed (backend reset for the next test):"]
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
    before = round_trips(backend)
    try:
        leaks, closing = _end_test(backend, request.node.stash.get(SWITCHES_KEY, []))
    finally:
        _add_round_trips(request.node, "teardown", before, backend)
    if leaks:
        request.node.stash[LEAKS_KEY] = leaks
        message = leak_message(leaks)
        if closing is not None:
            message += f"\n(and {closing})"
        pytest.fail(message, pytrace=False)
    if closing is not None:
        raise closing


def _has_connections(switch: Switch) -> bool:
    """Whether ``switch`` may have connections to close: pytest-san's own says (``connections``); another switch
    is closed always."""
    return bool(getattr(switch, "connections", True))


def _end_test(backend: Backend, switches: list[Switch]) -> tuple[list[str], SanError | None]:
    """Close the switches' connections, check for leaks, reset: (the leaks, what closing left, if anything).

    Closing failures are as ``Switch.close_all`` reports them: a socket already gone (WSAENOTSOCK) is no
    failure; anything else is one SanError naming each.
    """
    if not isinstance(backend, EndsTests):
        try:
            leaks = [str(leak) for leak in backend.leaks()]
        finally:
            backend.reset()  # the next test starts clean: processes, links and faults too, leaked or not
        return leaks, None

    def close() -> None:
        for switch in switches:
            switch.close_all()

    found, errors = backend.end_test(close if any(_has_connections(s) for s in switches) else None)
    problems: list[str] = []
    for error in errors:
        if isinstance(error, SanError) and error.code is WsaError.WSAENOTSOCK:
            continue
        text = str(error)
        problems.append(text.removeprefix("closing left errors: ") if isinstance(error, SanError) else repr(error))
    closing = SanError(WsaError.WSAEINVAL, "closing left errors: " + "; ".join(problems)) if problems else None
    return [str(leak) for leak in found], closing
