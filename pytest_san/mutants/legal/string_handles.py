"""Handles that are strings, not ints: ``"mr-17"`` for each registration (the same string for a registration the
wrapped provider answered with the same handle).

A handle is an opaque, hashable value of the provider's choosing, compared by equality (CONTRACT.md section 2):
nothing may assume an int. Each socket has its own handles; one not handed out on that socket, or no longer
registered there, is refused as the wrapped provider refuses an unknown one.
"""

from __future__ import annotations

import itertools
from typing import Any

from ..wrapping import SubstitutingHandles, provider_hook

UNKNOWN = "not a handle of this socket"
"""What the wrapped provider is given for a handle this one did not hand out on the socket: it refuses it."""

_serial = itertools.count(1)


class StringHandles(SubstitutingHandles):
    def _table(self, socket: Any) -> dict[str, Any]:
        """Our handles on ``socket`` -> the wrapped provider's."""
        tables: dict[int, dict[str, Any]] = self.shared.extra.setdefault("string_handles", {})
        return tables.setdefault(id(socket), {})

    def _inner(self, socket: Any, handle: Any) -> Any:
        return self._table(socket).get(handle, UNKNOWN) if isinstance(handle, str) else UNKNOWN

    def register_memory(self, socket: Any, buffer: Any, access: Any) -> Any:
        inner = self.inner.register_memory(socket, buffer, access)
        table = self._table(socket)
        ours = next((mine for mine, theirs in table.items() if theirs == inner), None) or f"mr-{next(_serial)}"
        table[ours] = inner
        self.shared.note(socket, buffer, access, "memory", ours)
        return ours

    def deregister_memory(self, socket: Any, handle: Any) -> None:
        self.inner.deregister_memory(socket, self._inner(socket, handle))
        if self.shared.forget(socket, handle) is not None:  # the last reference: the string names nothing now
            self._table(socket).pop(handle, None)

    def substitute(self, socket: Any, buffer: Any, handle: Any) -> Any:
        return self._inner(socket, handle)

    def close_socket(self, socket: Any) -> None:
        super().close_socket(socket)
        self.shared.extra.get("string_handles", {}).pop(id(socket), None)


pytest_san_make_provider = provider_hook(StringHandles)
