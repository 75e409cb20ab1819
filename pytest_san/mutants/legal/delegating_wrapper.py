"""A provider and a proxy that change nothing: every attribute is looked up on the wrapped one.

The plainest plugin there is (tracing and fault-injection wrappers start like this), with nothing of the
protocols spelled out: the suite must treat it exactly as the provider and proxy it wraps, and reach them only
through calls it forwards (NOLOWMEM is a call, ``set_nolowmem``, not an attribute to assign).
"""

from __future__ import annotations

from typing import Any

import pytest

from ...spi.protocols import Node, Provider, Proxy


class Forwarding:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def pytest_san_make_provider(config: pytest.Config, node: Node, provider: Provider) -> Any:
    return Forwarding(provider)


def pytest_san_make_proxy(config: pytest.Config, node: Node, proxy: Proxy) -> Any:
    return Forwarding(proxy)
