"""An emulated host: its proxy, its provider and its processes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .process import EmulatedProcess

if TYPE_CHECKING:
    from .provider import EmulatedProvider
    from .proxy import EmulatedProxy


class EmulatedNode:
    """A node of the emulated SAN. ``provider``/``proxy`` are what the hooks chose (maybe wrapped)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.processes: list[EmulatedProcess] = []
        self.base_provider: EmulatedProvider  # the emulator's own, under any wrapper
        self.base_proxy: EmulatedProxy
        self.provider: Any = None
        self.proxy: Any = None
        self.default_process = self.spawn_process()

    @property
    def name(self) -> str:
        return self._name

    def spawn_process(self) -> EmulatedProcess:
        process = EmulatedProcess(self)
        self.processes.append(process)
        return process

    def restart(self) -> None:
        """Kill every process and start a fresh default one (between tests)."""
        for process in self.processes:
            process.kill()
        self.processes = []
        self.default_process = self.spawn_process()

    def __repr__(self) -> str:
        return f"<node {self._name}>"
