"""get_dma_adapter fills the fields a DEVICE_DESCRIPTION left uninitialised with the NIC's defaults.

The bug: to be "forgiving", the proxy copies the caller's description over a template of the NIC's usual values
(version 0, bus master, scatter/gather, 64-bit DMA, 1 MiB transfers) and asks for the adapter with the result.
A description nobody zero-initialised, or one with fields left out, gets an adapter instead of being refused;
a field given with the wrong type is still refused, as the template only fills what is missing.

Realistic: defaults merged into a request structure, the opposite of what IoGetDmaAdapter demands (a zeroed
structure, filled in by the caller), and a way for a driver to get an adapter it did not describe.

Breaks P5 (a description left uninitialised is refused).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_san import DeviceDescription
from pytest_san.mutants.wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P5",)
TEMPLATE = DeviceDescription(version=0, master=True, scatter_gather=True, dma32=False, dma64=True,
                             maximum_length=1 << 20, interface_type=0)


class FillsTheGaps(DelegatingProxy):
    def get_dma_adapter(self, description: DeviceDescription) -> Any:
        if isinstance(description, DeviceDescription):
            missing = {field.name: getattr(TEMPLATE, field.name) for field in dataclasses.fields(description)
                       if getattr(description, field.name) is None}
            if "dma64" in missing and "dma32" not in missing:
                missing["dma64"] = not description.dma32  # the width the caller gave wins
            if "dma32" in missing and "dma64" not in missing:
                missing["dma32"] = not description.dma64
            if missing:
                description = dataclasses.replace(description, **missing)  # the bug
        return self.inner.get_dma_adapter(description)


pytest_san_make_proxy = proxy_hook(FillsTheGaps)
