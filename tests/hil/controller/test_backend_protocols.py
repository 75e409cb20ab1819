"""The hil backend is the one that ends tests in a batch and counts its round trips: the fixtures find both by
``isinstance`` (pytest_san.spi.protocols), so losing or renaming either would silently cost round trips."""

from __future__ import annotations

from hil.controller.backend import HilBackend
from pytest_san.batch import Batching
from pytest_san.spi.protocols import CountsRoundTrips, EndsTests


def test_the_hil_backend_has_every_optional_protocol_the_fixtures_and_the_model_look_for() -> None:
    for protocol in (EndsTests, CountsRoundTrips, Batching):
        assert issubclass(HilBackend, protocol), protocol.__name__
