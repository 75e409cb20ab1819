"""A provider that reports some error codes as others, for the bugs in error reporting."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ...spi.contract import SanError, WsaError
from ..wrapping import DelegatingProvider

CALLS = ("register_memory", "deregister_memory", "register_rdma_memory", "deregister_rdma_memory", "rdma_write",
         "rdma_read", "send", "recv", "close_socket", "getsockopt")


def recoding(codes: dict[WsaError, WsaError]) -> type[DelegatingProvider]:
    """A DelegatingProvider whose every call raises ``codes[e.code]`` instead of ``e.code``."""

    def wrap(call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def recoded(self: DelegatingProvider, *args: Any, **kwargs: Any) -> Any:
            try:
                return call(self, *args, **kwargs)
            except SanError as exc:
                if exc.code not in codes:
                    raise
                raise SanError(codes[exc.code], exc.message, required_size=exc.required_size) from exc

        return recoded

    return type("Recoding", (DelegatingProvider,), {name: wrap(getattr(DelegatingProvider, name)) for name in CALLS})
