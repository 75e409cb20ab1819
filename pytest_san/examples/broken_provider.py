"""A deliberately broken provider, plugged in through pytest-san's hook.

It registers every RDMA descriptor READWRITE whatever the caller asked for, so a peer can write
into read-only memory (R6) and read write-only memory (R7). Load it with ``-p`` to watch the
conformance suite catch it (exactly R6 and R7 fail, on any backend)::

    pytest --pyargs pytest_san.scenarios -p pytest_san.examples.broken_provider
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_san import Access, Node, Provider


class AccessIgnoringProvider:
    """Delegates everything to the real provider but widens RDMA registrations to READWRITE."""

    def __init__(self, inner: Provider) -> None:
        self._inner = inner

    def register_rdma_memory(self, socket: Any, buffer: Any, access: Access,
                             descriptor_size: int | None = None) -> bytes:
        if type(access) in (int, Access) and access in (Access.READ, Access.WRITE):  # a bool is no access
            access = Access.READWRITE  # the bug: the caller's restriction is dropped
        return self._inner.register_rdma_memory(socket, buffer, access, descriptor_size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def pytest_san_make_provider(config: pytest.Config, node: Node, provider: Provider) -> Provider:
    return AccessIgnoringProvider(provider)
