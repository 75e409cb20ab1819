"""Deprecated alias: ``SanError`` and ``WsaError`` live in ``pytest_san.spi.contract`` and are imported from
``pytest_san`` (CONTRACT.md section 5). Importing them from here still works, with a DeprecationWarning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._deprecated import forward

if TYPE_CHECKING:
    from .spi.contract import SanError, WsaError

__all__ = ["SanError", "WsaError"]

__getattr__ = forward(__name__, __all__)
