"""Deprecated alias: the contract's value types and constants live in ``pytest_san.spi.contract`` and are imported
from ``pytest_san`` (CONTRACT.md section 5). Importing a name from here still works, with a DeprecationWarning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._deprecated import forward

if TYPE_CHECKING:
    from .spi.contract import (
        DO_DIRECT_IO,
        FOUR_GIB,
        PAGE_SIZE,
        SO_MAX_RDMA_SIZE,
        SO_RDMA_THRESHOLD_SIZE,
        Access,
        CacheType,
        Completion,
        DeviceDescription,
        Leak,
        Status,
        is_int,
    )

__all__ = ["DO_DIRECT_IO", "FOUR_GIB", "PAGE_SIZE", "SO_MAX_RDMA_SIZE", "SO_RDMA_THRESHOLD_SIZE", "Access",
           "CacheType", "Completion", "DeviceDescription", "Leak", "Status", "is_int"]

__getattr__ = forward(__name__, __all__)
