"""``pytest_san.protocols``, the import path the specification names for the ``Switch`` protocol and its
kin: each name of ``pytest_san.spi.protocols``, where they are defined (and pushed to lab hosts with the rest
of the SPI)."""

from __future__ import annotations

from .spi.protocols import (
    Allocation,
    Backend,
    Buffer,
    CacheTypeProxy,
    CountsRoundTrips,
    DeclaresCapabilities,
    DeclaresModelBudget,
    Descriptor,
    DirectIoProxy,
    DmaAdapter,
    EndsTests,
    Faults,
    Handle,
    LocalBuffers,
    ModelBudget,
    Node,
    PendingOperation,
    PinnedBytesProxy,
    Process,
    Provider,
    Proxy,
    Registration,
    Socket,
    Switch,
    SwitchConnection,
    SwitchEndpoint,
    budget_of,
)

__all__ = [
    "Allocation", "Backend", "Buffer", "CacheTypeProxy", "CountsRoundTrips", "DeclaresCapabilities",
    "DeclaresModelBudget", "Descriptor", "DirectIoProxy", "DmaAdapter", "EndsTests", "Faults", "Handle",
    "LocalBuffers", "ModelBudget", "Node", "PendingOperation", "PinnedBytesProxy", "Process", "Provider", "Proxy",
    "Registration", "Socket", "Switch", "SwitchConnection", "SwitchEndpoint", "budget_of",
]
