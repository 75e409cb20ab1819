"""Winsock error codes and the exception every provider call raises (CONTRACT.md section 2).

Both live in ``pytest_san.contract``, the one module of the contract's values; imported from here too.
"""

from __future__ import annotations

from .contract import SanError, WsaError

__all__ = ["SanError", "WsaError"]
