"""A local registration keeps its length in 16 bits: a handle of 64 KiB or more covers only the length's low bits.

Breaks R8: the bytes of a large registration past its first ``length % 65536`` are rejected as outside it, and a
registration of 1 MiB + 1 bytes covers one byte. Realistic: a handle table entry packed as ``{u64 address; u16
length; u16 access}``, written when message buffers were the only registrations.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook, widened

BREAKS = ("R8",)


class HandleLength16Bits(DelegatingProvider):
    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        length = getattr(buffer, "length", None)
        if type(length) is int and length >= 1 << 16:
            buffer = widened(buffer, 0, (length & 0xFFFF) - length)
        return super().register_memory(socket, buffer, access)


pytest_san_make_provider = provider_hook(HandleLength16Bits)
