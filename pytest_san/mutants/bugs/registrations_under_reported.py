"""``registrations()`` leaves out RDMA registrations.

Breaks R11: a socket's live RDMA registration -- one a close would have to release -- is not reported, so what
close leaves behind cannot be seen. Realistic: introspection that walks the handle table and forgets the window
table (and a checker that trusts it would miss a leak).
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R11",)


class RegistrationsUnderReported(DelegatingProvider):
    def registrations(self, socket: Any) -> Any:
        return [reg for reg in super().registrations(socket) if reg.kind != "rdma"]


pytest_san_make_provider = provider_hook(RegistrationsUnderReported)
