"""Under NOLOWMEM the proxy falls back to memory below 4 GiB once memory above it runs out.

The bug: an ordinary allocation (a pin for a registration) is first tried above 4 GiB as NOLOWMEM wants; when that
fails, the proxy retries without the restriction "rather than fail the registration", and the pages land below
4 GiB. While memory above 4 GiB lasts nothing shows.

Realistic: a GFP fallback chain (``__GFP_HIGHMEM`` first, then anything) written for robustness, defeating the
very mode that reserves low memory for 32-bit DMA.

Breaks P3 (under NOLOWMEM ordinary allocations never land below 4 GiB, not even when the memory above runs
short: the proxy refuses instead).
"""

from __future__ import annotations

from typing import Any

from pytest_san import SanError, WsaError
from pytest_san.mutants.wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P3",)


class FallsBackLow(DelegatingProxy):
    def allocate(self, nbytes: int) -> Any:
        try:
            return self.inner.allocate(nbytes)
        except SanError as exc:
            if exc.code != WsaError.WSAENOBUFS or not self.inner.nolowmem:
                raise
        self.inner.set_nolowmem(False)  # the bug: retried anywhere
        try:
            return self.inner.allocate(nbytes)
        finally:
            self.inner.set_nolowmem(True)


pytest_san_make_proxy = proxy_hook(FallsBackLow)
