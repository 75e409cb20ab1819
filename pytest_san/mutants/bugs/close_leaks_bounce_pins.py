"""Each RDMA registration pins a bounce buffer that deregistration frees but closing the socket forgets.

Breaks R11 (memory stays allocated in the proxy after close) and R12 (a registration pins twice). Realistic: the
release path of close walks the provider's registration table and frees the MRs, not the provider's own
per-registration resources.
"""

from __future__ import annotations

from ..wrapping import provider_hook
from ._pins import BouncePins

BREAKS = ("R11", "R12")


class CloseLeaksBouncePins(BouncePins):
    kinds = ("rdma",)
    free_on_close = False


pytest_san_make_provider = provider_hook(CloseLeaksBouncePins)
