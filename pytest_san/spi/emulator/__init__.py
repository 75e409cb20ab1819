"""The in-process emulator: a SAN fabric of nodes, processes, providers and proxies."""

from ..contract import DESCRIPTOR_SIZE
from .backend import EmulatorBackend, EmulatorFaults
from .node import EmulatedNode
from .process import EmulatedBuffer, EmulatedProcess
from .provider import EmulatedProvider
from .proxy import EmulatedProxy
from .sockets import EmulatedOperation, EmulatedSocket

__all__ = [
    "DESCRIPTOR_SIZE", "EmulatedBuffer", "EmulatedNode", "EmulatedOperation", "EmulatedProcess",
    "EmulatedProvider", "EmulatedProxy", "EmulatedSocket", "EmulatorBackend", "EmulatorFaults",
]
