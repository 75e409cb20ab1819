"""A ``descriptor_size`` of 0 is taken as "not given": the registration is made instead of answering the probe.

The bug: the probe is written ``if descriptor_size and descriptor_size < needed: raise WSAEFAULT(needed)``, so 0,
the natural first probe ("how big is a descriptor?"), skips it: the memory is registered and a descriptor
returned to a caller that said it had room for none. Every other size below the needed one is the probe.

Realistic: 0 as falsy in a C or Python size check; the SPI's probe is precisely a call with a zero-length
buffer.

Breaks R14 (WSAEFAULT carrying the required size for every descriptor_size from 0 up to it, and nothing
registered).
"""

from __future__ import annotations

from pytest_san import Access
from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Buffer, Descriptor, Socket

BREAKS = ("R14",)


class ZeroIsUnset(DelegatingProvider):
    def register_rdma_memory(self, socket: Socket, buffer: Buffer, access: Access,
                             descriptor_size: int | None = None) -> Descriptor:
        if type(descriptor_size) is int and descriptor_size == 0:
            descriptor_size = None  # the bug: "if descriptor_size and ..."
        return super().register_rdma_memory(socket, buffer, access, descriptor_size)


pytest_san_make_provider = provider_hook(ZeroIsUnset)
