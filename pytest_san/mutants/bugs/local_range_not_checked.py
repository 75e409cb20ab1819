"""A local buffer is taken under any valid handle of its socket, wherever the buffer lies.

Breaks R1 (a receive lands in memory that was never registered, named with a handle of other memory) and R8 (a
source or sink reaching past its registration is used). Realistic: a provider that validates the handle (the
lkey exists) but not that the buffer lies inside the registration it names, and registers the stray range on the
fly to make the transfer work.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import SubstitutingHandles, inside, provider_hook

BREAKS = ("R1", "R8")


class LocalRangeNotChecked(SubstitutingHandles):
    def substitute(self, socket: Any, buffer: Any, handle: Any) -> Any:
        reg = self.shared.registered.get((id(socket), handle))
        if reg is None or reg.kind != "memory" or inside(buffer, reg):
            return handle
        found = self.register_quietly(socket, buffer, reg.access)
        return handle if found is None else found


pytest_san_make_provider = provider_hook(LocalRangeNotChecked)
