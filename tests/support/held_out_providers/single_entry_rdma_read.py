"""An RDMA read lands in one local buffer only (the device's max_sge_rd is 1, as on siw): a longer list is
WSAEINVAL, and the provider declares no ``rdma_read_scatter``.

Legal: how many entries the device takes is its own (CONTRACT.md section 4, the ``device`` row); scenarios that
read into several buffers need ``rdma_read_scatter`` and are skipped, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_san import SanError, WsaError
from pytest_san.mutants.wrapping import DelegatingProvider, entries, provider_hook
from pytest_san.spi.protocols import Buffer


class SingleEntryRdmaRead(DelegatingProvider):
    @property
    def san_capabilities(self) -> Mapping[str, bool]:
        return {"rdma_read_scatter": False}

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        # What the device takes is looked up after the objects are judged (the reference order): a malformed
        # list, or a closed socket, is the wrapped provider's to answer.
        well_formed = (isinstance(local_buffers, list | tuple)
                       and len(list(entries(local_buffers))) == len(local_buffers) > 1
                       and all(isinstance(buffer, Buffer) for buffer, _ in entries(local_buffers)))
        # (It read ``socket.connected`` of whatever came as the socket, an AttributeError for no socket at all:
        # the generated bad-argument cases of issue 37 found it; a socket that is none is the wrapped provider's.)
        if well_formed and getattr(socket, "connected", False) is True:
            raise SanError(WsaError.WSAEINVAL, f"{len(local_buffers)} buffers: an RDMA read here takes one")
        return super().rdma_read(socket, local_buffers, source_descriptor, offset)


pytest_san_make_provider = provider_hook(SingleEntryRdmaRead)
