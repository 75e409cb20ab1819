"""``registrations()`` lists every registration twice.

Breaks R9, R10 and R11 as far as they are checked through it: the switch seems to hold four message regions and
to keep its RDMA registrations. Realistic: introspection that concatenates the per-socket table with a
per-process one that holds the same entries.
"""

from __future__ import annotations

from typing import Any

from ..wrapping import DelegatingProvider, provider_hook

BREAKS = ("R9", "R10", "R11")


class RegistrationsReportedTwice(DelegatingProvider):
    def registrations(self, socket: Any) -> Any:
        found = list(super().registrations(socket))
        return found + found


pytest_san_make_provider = provider_hook(RegistrationsReportedTwice)
