"""Another switch altogether: ``pytest_san.examples.simple_switch``, which shares no code with pytest-san's own.

Legal: it keeps R9-R11 as the contract states them, with its own framing (one record stream per direction cut
into messages anywhere), flow control (running counts, not credit deltas) and ring (16 messages of 1 KiB).
"""

from __future__ import annotations

from ...examples.simple_switch import pytest_san_make_switch

__all__ = ["pytest_san_make_switch"]
