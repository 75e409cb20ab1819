"""A zero-length scatter entry is left out of the work request, so its handle is never checked.

Breaks R1 (another socket's handle is taken), R3 (a deregistered handle is taken) and R14 (the operation should
complete LOCAL_PROTECTION). Realistic: a verbs provider that drops zero-length SGEs before posting (some NICs
reject them) and validates only what it posts. Found by an outside set of planted bugs (issue 37).
"""

from __future__ import annotations

from typing import Any

from ..wrapping import SubstitutingHandles, provider_hook

BREAKS = ("R1", "R3", "R14")


class ZeroLengthEntriesUnchecked(SubstitutingHandles):
    def substitute(self, socket: Any, buffer: Any, handle: Any) -> Any:
        if getattr(buffer, "length", None) != 0 or (id(socket), handle) in self.shared.registered:
            return handle
        # What the wrapped provider sees: a handle it holds for that socket, as if the entry had been skipped.
        return next((h for (sid, h), reg in self.shared.registered.items()
                     if sid == id(socket) and reg.kind == "memory"), handle)


pytest_san_make_provider = provider_hook(ZeroLengthEntriesUnchecked)
