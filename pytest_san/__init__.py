"""pytest-san: conformance testing of RDMA memory registration for SAN providers.

The public names downstream tests use (CONTRACT.md section 5) are importable from here.
"""

from .deviations import Deviation
from .spi.contract import (
    DO_DIRECT_IO,
    FOUR_GIB,
    PAGE_SIZE,
    SO_MAX_RDMA_SIZE,
    SO_RDMA_THRESHOLD_SIZE,
    Access,
    CacheType,
    Completion,
    DeviceDescription,
    Leak,
    SanError,
    Status,
    WsaError,
)
from .spi.protocols import (
    Backend,
    Buffer,
    Descriptor,
    DmaAdapter,
    Faults,
    Handle,
    Node,
    PendingOperation,
    Process,
    Provider,
    Proxy,
    Socket,
)

# pytest-san's own switch and what it makes (classes). What any switch keeps, and what san_switch and the
# scenarios are typed by, are the protocols pytest_san.protocols.Switch, SwitchConnection and SwitchEndpoint.
from .switch import Connection, Endpoint, Switch

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (dynamic = ["version"])

__all__ = [
    "DO_DIRECT_IO", "FOUR_GIB", "PAGE_SIZE", "SO_MAX_RDMA_SIZE", "SO_RDMA_THRESHOLD_SIZE", "Access", "Backend",
    "Buffer", "CacheType", "Completion", "Connection", "Descriptor", "Deviation", "DeviceDescription", "DmaAdapter",
    "Endpoint", "Faults", "Handle", "Leak", "Node", "PendingOperation", "Process", "Provider", "Proxy",
    "SanError", "Socket", "Status", "Switch", "WsaError",
]
