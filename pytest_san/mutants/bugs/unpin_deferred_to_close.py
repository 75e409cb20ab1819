"""Deregistration leaves the pages pinned; they are freed only when the socket closes.

Breaks R12: each deregistration frees its allocation. Realistic: unpinning deferred to a cleanup pass at close
(to avoid a kernel call per deregister), so a long-lived socket that registers per transfer pins without bound.
"""

from __future__ import annotations

from ..wrapping import provider_hook
from ._pins import BouncePins

BREAKS = ("R12",)


class UnpinDeferredToClose(BouncePins):
    free_on_deregister = False


pytest_san_make_provider = provider_hook(UnpinDeferredToClose)
