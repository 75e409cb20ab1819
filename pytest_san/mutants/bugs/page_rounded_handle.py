"""A register_memory registration covers the whole pages its buffer touches.

Breaks R8: a local buffer that starts before, or ends after, the registered range but inside the same pages is
taken as a source or sink. Realistic: the pages are what gets pinned, and the provider checks a local range
against the pinned pages instead of the range the caller registered.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, page_rounded, provider_hook

BREAKS = ("R8",)


class PageRoundedHandle(DelegatingProvider):
    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        return super().register_memory(socket, page_rounded(buffer)[0], access)


pytest_san_make_provider = provider_hook(PageRoundedHandle)
