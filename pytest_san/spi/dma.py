"""A DMA adapter's books, for every proxy that hands adapters out (P5): the DEVICE_DESCRIPTION's checks, the common
buffers an adapter handed out (each freed only with the very values it was allocated with), and the checks of
``put_dma_adapter``.

Where a common buffer's memory comes from is the proxy's own: ``DmaAdapterBooks._take`` and ``_give_back`` (the
emulator's page frames, a lab host's hugetlb pages). The hil agent's verbs engine imports it on lab hosts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any, TypeVar

from .contract import MAX_DESCRIPTION_VERSION, SanError, WsaError, is_int

#: A proxy's own adapter type (a DmaAdapterBooks subclass).
A = TypeVar("A", bound="DmaAdapterBooks")

DESCRIPTION_INTS = ("version", "maximum_length", "interface_type")
DESCRIPTION_FLAGS = ("master", "scatter_gather", "dma32", "dma64")


def einval(message: str) -> SanError:
    return SanError(WsaError.WSAEINVAL, message)


def check_integers(call: str, **values: object) -> None:
    """WSAEINVAL, before anything changes, for a size or address that is not an integer (True and 1.0 are not)."""
    bad = [f"{name} {value!r:.40}" for name, value in values.items() if not is_int(value)]
    if bad:
        raise einval(f"{call}: not integers: {', '.join(bad)}")


def check_flag(call: str, name: str, value: object) -> None:
    if type(value) is not bool:
        raise einval(f"{call}: {name} must be True or False, got {value!r:.40}")


def check_description(description: object) -> dict[str, Any]:
    """The fields of a DEVICE_DESCRIPTION (an object with them as attributes, or a dict of them), checked:
    WSAEINVAL naming every problem. An uninitialised field is None."""

    def field(name: str) -> object:
        if isinstance(description, dict):
            return description.get(name)
        return getattr(description, name, None)

    values: dict[str, Any] = {name: field(name) for name in DESCRIPTION_INTS + DESCRIPTION_FLAGS}
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise einval(f"get_dma_adapter: uninitialised fields {', '.join(missing)} in {description!r:.200} "
                     "(a DEVICE_DESCRIPTION must be zero-initialised, then filled in)")
    problems = [f"{n} must be an integer, got {values[n]!r:.40}" for n in DESCRIPTION_INTS if not is_int(values[n])]
    problems += [f"{n} must be True or False, got {values[n]!r:.40}" for n in DESCRIPTION_FLAGS
                 if type(values[n]) is not bool]
    if not problems:
        if values["master"] is not True:
            problems.append("master must be True (a SAN NIC is a bus master)")
        if values["maximum_length"] <= 0:
            problems.append(f"maximum_length must be positive, got {values['maximum_length']}")
        if not 0 <= values["version"] <= MAX_DESCRIPTION_VERSION:
            problems.append(f"version {values['version']} is not 0..{MAX_DESCRIPTION_VERSION}")
    if problems:
        raise einval(f"get_dma_adapter: {'; '.join(problems)}")
    return values


@dataclasses.dataclass(frozen=True)
class CommonBuffer:
    """A common buffer an adapter handed out: what allocate_common_buffer was given and returned, and ``held``,
    what the proxy needs to take its memory back."""

    logical: int
    length: int
    virtual: int
    cache_enabled: bool
    held: object = dataclasses.field(repr=False)


class DmaAdapterBooks:
    """A DMA adapter (the DmaAdapter protocol) but for its memory: a subclass takes (``_take``) and gives back
    (``_give_back``) a common buffer's pages."""

    def __init__(self, dma32: bool) -> None:
        self._dma32 = dma32
        self.buffers: dict[int, CommonBuffer] = {}  # logical address -> buffer
        self.put = False

    @property
    def dma32(self) -> bool:
        return self._dma32

    def allocate_common_buffer(self, length: int, cache_enabled: bool) -> tuple[int, int] | None:
        """(virtual, logical) of a physically contiguous buffer; None when there is no such memory."""
        self._check_usable("allocate_common_buffer")
        check_integers("allocate_common_buffer", length=length)
        check_flag("allocate_common_buffer", "cache_enabled", cache_enabled)
        if length <= 0:
            return None
        taken = self._take(length, cache_enabled)
        if taken is None:
            return None
        virtual, logical, held = taken
        self.buffers[logical] = CommonBuffer(logical, length, virtual, cache_enabled, held)
        return virtual, logical

    def free_common_buffer(self, length: int, logical: int, virtual: int, cache_enabled: bool) -> None:
        """Needs exactly the values allocate_common_buffer was called with and returned."""
        self._check_usable("free_common_buffer")
        check_integers("free_common_buffer", length=length, logical=logical, virtual=virtual)
        check_flag("free_common_buffer", "cache_enabled", cache_enabled)
        buf = self.buffers.get(logical)
        if buf is None or (length, virtual, cache_enabled) != (buf.length, buf.virtual, buf.cache_enabled):
            raise einval(f"free_common_buffer(length={length}, logical={logical:#x}, virtual={virtual:#x}, "
                         f"cache_enabled={cache_enabled}): no such common buffer on {self!r}; "
                         f"live: {list(self.buffers.values())}")
        self._release_buffer(buf)

    def release(self) -> None:
        """Every common buffer given back, and the adapter put (put_dma_adapter's, once none is left, and a
        proxy's reset)."""
        for buf in list(self.buffers.values()):
            self._release_buffer(buf)
        self.put = True

    def _release_buffer(self, buf: CommonBuffer) -> None:
        del self.buffers[buf.logical]
        self._give_back(buf)

    def _check_usable(self, call: str) -> None:
        if self.put:
            raise einval(f"{call}: {self!r} was already put")

    def _take(self, length: int, cache_enabled: bool) -> tuple[int, int, object] | None:
        """(virtual, logical, what ``_give_back`` needs) of ``length`` contiguous bytes this adapter can reach,
        mapped cached or not as ``cache_enabled`` says where the platform can tell them apart, or None."""
        raise NotImplementedError

    def _give_back(self, buf: CommonBuffer) -> None:
        raise NotImplementedError


def checked_put(live: Collection[A], adapter: object, kind: type[A], owner: str) -> A:
    """put_dma_adapter's checks: ``adapter`` is one of ``live``, of ``kind``, with no common buffer left; it is
    returned for the proxy to release (``release``) and drop from ``live``."""
    if type(adapter) is not kind or adapter not in live:
        raise einval(f"put_dma_adapter: {adapter!r:.120} is not a live adapter of {owner} "
                     "(put already, or another proxy's)")
    if adapter.buffers:
        raise einval(f"put_dma_adapter: {adapter!r} still has {len(adapter.buffers)} common buffer(s); "
                     "free them first")
    return adapter
