"""getsockopt answers from a per-socket cache, filled at the first ask, without checking the socket again.

The bug: the two options are constant for a socket's life, so the provider caches each socket's answers (keyed
by the socket and the option value) and returns the cached one before any check. A socket that has since been
closed still answers, where it is no longer a socket (WSAENOTSOCK); and a value that merely equals a cached
option (``float(SO_MAX_RDMA_SIZE)``) hashes to the same entry and is answered too, where it is no option.

Realistic: memoising a "constant" in front of the validation, a classic; the float case is Python's dict
equality, the C analogue is an option compared after a cast.

Breaks R4 (a closed socket is WSAENOTSOCK, for every call) and R14 (getsockopt of anything but the two integer
options is WSAEINVAL; the error codes of section 2).
"""

from __future__ import annotations

import contextlib
from typing import Any

from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Socket

BREAKS = ("R4", "R14")
CACHE = "getsockopt_answers_from_a_cache"


class CachedOptions(DelegatingProvider):
    def getsockopt(self, socket: Socket, option: int) -> int:
        cache: dict[tuple[int, Any], tuple[Socket, int]] = self.shared.extra.setdefault(CACHE, {})
        try:
            hit = cache.get((id(socket), option))
        except TypeError:  # an unhashable option: no cache entry
            hit = None
        if hit is not None and hit[0] is socket:
            return hit[1]  # the bug: answered before the socket (or the option's type) is looked at
        value = super().getsockopt(socket, option)
        with contextlib.suppress(TypeError):  # an unhashable option the wrapped provider took: not cached
            cache[id(socket), option] = (socket, value)
        return value


pytest_san_make_provider = provider_hook(CachedOptions)
