"""The DMA adapter's books (``pytest_san.spi.dma``) on their own, as the verbs agent uses them on a lab host: there a
DEVICE_DESCRIPTION arrives as a dict off the wire, and the common buffers' memory is the agent's (its ``_take`` and
``_give_back``). The scenarios reach the books only through the emulator's proxy, which passes a
``DeviceDescription`` and whose memory keeps nothing to give back; these tests hold the rest."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pytest_san import SanError, WsaError
from pytest_san.spi.contract import DeviceDescription
from pytest_san.spi.dma import CommonBuffer, DmaAdapterBooks, check_description

FIELDS: dict[str, Any] = {"version": 0, "maximum_length": 4096, "interface_type": 5, "master": True,
                          "scatter_gather": True, "dma32": False, "dma64": True}


class Books(DmaAdapterBooks):
    """An adapter whose memory says what it was asked: each ``_take`` gets the next page and holds a token."""

    def __init__(self) -> None:
        super().__init__(dma32=False)
        self.taken: list[tuple[int, bool]] = []
        self.given_back: list[CommonBuffer] = []

    def _take(self, length: int, cache_enabled: bool) -> tuple[int, int, object]:
        self.taken.append((length, cache_enabled))
        n = len(self.taken)
        return 0x7F00_0000 + n * 0x1000, 0x1000 * n, f"token {n}"

    def _give_back(self, buf: CommonBuffer) -> None:
        self.given_back.append(buf)


def test_a_description_as_a_dict_is_checked_as_one_as_an_object() -> None:
    assert check_description(dict(FIELDS)) == FIELDS
    assert check_description(DeviceDescription(**FIELDS)) == FIELDS
    with pytest.raises(SanError) as info:
        check_description({**FIELDS, "master": False})
    assert info.value.code is WsaError.WSAEINVAL and "master" in info.value.message


@pytest.mark.parametrize("missing", sorted(FIELDS))
@pytest.mark.parametrize("shape", ["dict", "object"])
def test_a_field_left_out_is_named_as_uninitialised(missing: str, shape: str) -> None:
    """A field absent (a dict without it, an object without the attribute) or None is WSAEINVAL naming it, never an
    AttributeError or KeyError."""
    values = {k: v for k, v in FIELDS.items() if k != missing}
    given: Any = values if shape == "dict" else type("Partial", (), values)()
    with pytest.raises(SanError) as info:
        check_description(given)
    assert info.value.code is WsaError.WSAEINVAL
    assert f"uninitialised fields {missing}" in info.value.message
    with pytest.raises(SanError) as info:
        check_description(dataclasses.replace(DeviceDescription(**FIELDS), **{missing: None}))
    assert f"uninitialised fields {missing}" in info.value.message


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_a_common_buffer_is_taken_as_asked_and_given_back_with_what_was_held(cache_enabled: bool) -> None:
    books = Books()
    virtual, logical = books.allocate_common_buffer(8192, cache_enabled) or (0, 0)
    assert books.taken == [(8192, cache_enabled)]
    books.free_common_buffer(8192, logical, virtual, cache_enabled)
    assert [(b.logical, b.length, b.virtual, b.cache_enabled, b.held) for b in books.given_back] == [
        (logical, 8192, virtual, cache_enabled, "token 1")]
    assert books.buffers == {}


def test_release_gives_back_every_buffer_left_then_the_adapter_is_put() -> None:
    """A proxy's reset after a test leaked common buffers: each is given back with what was held, and the adapter
    takes no more calls."""
    books = Books()
    made = [books.allocate_common_buffer(4096, True), books.allocate_common_buffer(4096, False)]
    books.release()
    assert sorted(str(b.held) for b in books.given_back) == ["token 1", "token 2"]
    assert {b.logical for b in books.given_back} == {logical for _, logical in filter(None, made)}
    assert books.buffers == {}
    with pytest.raises(SanError) as info:
        books.allocate_common_buffer(4096, True)
    assert info.value.code is WsaError.WSAEINVAL
