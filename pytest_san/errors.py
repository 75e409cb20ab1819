"""Winsock error codes and the exception every provider call raises (SPEC.md section 2)."""

from __future__ import annotations

import enum


class WsaError(enum.IntEnum):
    """Error codes a SAN provider reports, with their Winsock values."""

    WSA_OPERATION_ABORTED = 995
    WSA_IO_PENDING = 997
    WSAEFAULT = 10014
    WSAEINVAL = 10022
    WSAENOTSOCK = 10038
    WSAEOPNOTSUPP = 10045
    WSAENETDOWN = 10050
    WSAECONNRESET = 10054
    WSAENOBUFS = 10055
    WSAENOTCONN = 10057


class SanError(Exception):
    """A provider or proxy call refused: ``code`` says why.

    ``required_size`` is set by the descriptor-too-small probe of
    ``register_rdma_memory`` (WSAEFAULT carrying the size the caller must supply).
    """

    def __init__(self, code: WsaError, message: str = "", *, required_size: int | None = None) -> None:
        self.code = WsaError(code)
        self.required_size = required_size
        text = f"{self.code.name} ({int(self.code)})"
        if message:
            text += f": {message}"
        super().__init__(text)

    def __reduce__(self) -> tuple[object, ...]:
        # Keep pickling (pytest-xdist, the HIL channel) lossless.
        return (_rebuild, (int(self.code), self.args[0], self.required_size))


def _rebuild(code: int, text: str, required_size: int | None) -> SanError:
    err = SanError(WsaError(code), required_size=required_size)
    err.args = (text,)
    return err
