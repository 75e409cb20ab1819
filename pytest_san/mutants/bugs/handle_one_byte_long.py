"""A register_memory registration covers one byte more than the buffer.

Breaks R8: a local buffer reaching one byte past its registration is taken as a source or sink. Realistic: the
same inclusive-end slip as in the window, in the provider's own table of local handles.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook, widened

BREAKS = ("R8",)


class HandleOneByteLong(DelegatingProvider):
    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        return super().register_memory(socket, widened(buffer, 0, 1), access)


pytest_san_make_provider = provider_hook(HandleOneByteLong)
