"""At close the switch deregisters its receive region although its posted receives still use it.

Breaks R11 (the switch deregisters only what no pending operation uses; the provider releases the rest at close):
the provider refuses (WSAEINVAL, R13) and the close fails. Realistic: a close path that releases both regions
without looking at what is in flight. Over ``pytest_san.examples.simple_switch``.
"""

from __future__ import annotations

from ...examples.simple_switch import Release, SimpleEndpoint
from ..switching import simple_switch_hook

BREAKS = ("R11",)


class DeregistersBusy(SimpleEndpoint):
    def releases(self) -> list[Release]:
        found = super().releases()
        busy = (self.provider.deregister_memory, self.handles[1])
        return found if busy in found else [*found, busy]  # the bug


pytest_san_make_switch = simple_switch_hook(DeregistersBusy)
