"""Fixtures only the conformance scenarios use (the public ones come from the plugin)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_san import Backend
from pytest_san.spi import protocols
from pytest_san.spi.protocols import Switch, SwitchConnection

from ..plugin.fixtures import make_switch
from .support import RawEnd, close_ends
from .watching import Watched


@pytest.fixture
def conn(san_switch: Switch) -> SwitchConnection:
    """A connection made by the switch between the first two nodes."""
    return san_switch.connect()


@pytest.fixture
def raw_pair(san_backend: Backend, san_switch: object) -> Iterator[tuple[RawEnd, RawEnd]]:
    """A connected socket pair between the first two nodes, without the switch; closed afterwards."""
    nodes = san_backend.nodes
    pa, pb = nodes[0].default_process, nodes[min(1, len(nodes) - 1)].default_process
    sa, sb = san_backend.connect_sockets(pa, pb)
    ends = (RawEnd(sa, pa, pa.node.provider, pa.node.proxy), RawEnd(sb, pb, pb.node.provider, pb.node.proxy))
    yield ends
    close_ends(san_backend, ends)


@pytest.fixture
def watched_switch(san_backend: Backend,
                   request: pytest.FixtureRequest) -> Iterator[tuple[protocols.Switch, Watched]]:
    """The switch under test (``pytest_san_make_switch``'s, else pytest-san's own) made over ``Watched(backend)``,
    which writes down each provider call the switch makes; its connections are closed afterwards."""
    backend = Watched(san_backend)
    switch = make_switch(request.config, backend)
    yield switch, backend
    switch.close_all()
