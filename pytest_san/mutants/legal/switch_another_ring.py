"""A switch with a fixed ring of three message slots per direction, whatever ``message_count`` asked, and says so.

Legal: how many messages a switch keeps posted is its own choice (R9 asks for two regions, not their size); the
connection declares the ring it uses (``SwitchConnection.message_count``). Three is the least pytest-san's own
switch takes, so every flow-control path is at its tightest. Over pytest-san's own switch.
"""

from __future__ import annotations

from typing import Any

from ..switching import SwitchWrapper, own_switch, switch_hook, usable

RING = 3


class SmallRing(SwitchWrapper):
    def adjust(self, options: dict[str, Any]) -> dict[str, Any]:
        if usable(options, "message_count", RING, 1024):
            options["message_count"] = RING
        return options


pytest_san_make_switch = switch_hook(lambda backend: SmallRing(own_switch(backend)))
