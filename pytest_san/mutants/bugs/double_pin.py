"""Each registration pins its memory twice through the proxy (both freed again in the end).

Breaks R12: one registration, one allocation. Realistic: the provider pins the pages itself and also asks the
proxy to, each path written by someone who thought the other one did not.
"""

from __future__ import annotations

from ..wrapping import provider_hook
from ._pins import BouncePins

BREAKS = ("R12",)


class DoublePin(BouncePins):
    pass


pytest_san_make_provider = provider_hook(DoublePin)
