"""DO_DIRECT_IO in a modelled process: its own buffers pinned by pytest-san's kernel module (P1).

A direct-I/O driver locks the requester's pages in the requester's context, so the pin is made here, in the
child process that owns the buffer: ``/dev/san_proxy`` pins the pages of whoever calls it
(``pin_user_pages_fast``, counted in this process's VmPin). The device is opened on the first pin; closing it
(or this process ending) unpins whatever is left. ``frames`` is where this process's page tables put a range
now (/proc/self/pagemap), for the pin to be compared with.

Standard library only, Python 3.9 compatible.
"""

from __future__ import annotations

from typing import Any

from hil.agent.engines.verbs.kernel_proxy import as_san_error
from hil.agent.engines.verbs.memory import Buffers
from hil.agent.engines.verbs.physical import physical_runs
from hil.agent.engines.verbs.proxy_module import KIND_PIN, ProxyDevice
from pytest_san.spi.contract import SanError, WsaError, is_int


class Pins:
    """The pins this process holds through the module."""

    def __init__(self, buffers: Buffers) -> None:
        self._buffers = buffers
        self._device: ProxyDevice | None = None
        self._pins: dict[int, int] = {}  # id -> pages pinned

    def _checked(self, call: str, address: int, length: int) -> None:
        if not is_int(address) or not is_int(length):
            raise SanError(WsaError.WSAEINVAL, f"{call}: address and length must be integers")
        if length < 0:
            raise SanError(WsaError.WSAEINVAL, f"{call}: a negative length ({length})")
        if self._buffers.mapping_of(address, length) is None:
            raise SanError(WsaError.WSAEFAULT, f"{call}: {length} bytes at {address:#x} are not inside a buffer of "
                                               f"pid {self._buffers.pid} (or are none)")

    def pin(self, address: int, length: int) -> dict[str, Any]:
        self._checked("pin", address, length)
        if self._device is None:
            try:
                self._device = ProxyDevice()
            except OSError as exc:
                raise as_san_error(exc, "pin") from None
        try:
            pin_id, pages = self._device.pin(address, length)
            runs = self._device.query(pin_id).runs
        except OSError as exc:
            raise as_san_error(exc, "pin") from None
        self._pins[pin_id] = pages
        return {"id": pin_id, "pages": pages, "runs": [list(run) for run in runs]}

    def unpin(self, pin_id: int) -> None:
        if self._device is None or pin_id not in self._pins:
            raise SanError(WsaError.WSAEINVAL, f"unpin: pid {self._buffers.pid} holds no pin {pin_id!r:.40}")
        try:
            self._device.free(pin_id, KIND_PIN)
        except OSError as exc:
            raise as_san_error(exc, "unpin") from None
        del self._pins[pin_id]

    def frames(self, address: int, length: int) -> list[list[int]]:
        self._checked("physical_runs", address, length)
        return [list(run) for run in physical_runs(address, length)]

    def close(self) -> None:
        """Every pin let go (the module unpins what the closed file held)."""
        if self._device is not None:
            self._device.close()
            self._device = None
        self._pins.clear()
