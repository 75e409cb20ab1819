"""``get_dma_adapter`` fills in a DEVICE_DESCRIPTION that was not zero-initialised instead of refusing it.

Breaks P5: anything left uninitialised is refused. Realistic: a proxy that "defaults" missing fields and so
accepts a stack structure full of garbage on a real system.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...spi.contract import DeviceDescription
from ..wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P5",)


class ProxyDescriptionRepaired(DelegatingProxy):
    def get_dma_adapter(self, description: Any) -> Any:
        if isinstance(description, DeviceDescription) and description.uninitialised():
            given = {k: v for k, v in dataclasses.asdict(description).items() if v is not None}
            description = dataclasses.replace(DeviceDescription.zeroed(), **given)
        return super().get_dma_adapter(description)


pytest_san_make_proxy = proxy_hook(ProxyDescriptionRepaired)
