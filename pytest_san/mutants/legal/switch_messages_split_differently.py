"""A switch whose messages are as small as pytest-san's own switch allows (64 bytes), whatever was asked.

Legal: how the switch cuts application data and its session protocol into messages is its own business; a 6 KiB
send becomes a hundred messages, a descriptor may need several. The connection declares the size it uses
(``SwitchConnection.message_size``). Over pytest-san's own switch.
"""

from __future__ import annotations

from typing import Any

from ..switching import SwitchWrapper, own_switch, switch_hook, usable

SIZE = 64


class SmallMessages(SwitchWrapper):
    def adjust(self, options: dict[str, Any]) -> dict[str, Any]:
        if usable(options, "message_size", SIZE, 1 << 20):
            options["message_size"] = SIZE
        return options


pytest_san_make_switch = switch_hook(lambda backend: SmallMessages(own_switch(backend)))
