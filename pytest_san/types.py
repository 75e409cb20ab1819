"""Value types of the contract: completions, device descriptions, leaks (CONTRACT.md section 2); the
flags, statuses and constants come from ``pytest_san.contract``."""

from __future__ import annotations

import dataclasses

from .contract import (
    DO_DIRECT_IO,
    FOUR_GIB,
    PAGE_SIZE,
    SO_MAX_RDMA_SIZE,
    SO_RDMA_THRESHOLD_SIZE,
    Access,
    CacheType,
    Status,
    is_int,
)

__all__ = ["DO_DIRECT_IO", "FOUR_GIB", "PAGE_SIZE", "SO_MAX_RDMA_SIZE", "SO_RDMA_THRESHOLD_SIZE", "Access",
           "CacheType", "Completion", "DeviceDescription", "Leak", "Status", "is_int"]


@dataclasses.dataclass(frozen=True)
class Completion:
    """What a finished operation yields [WSPGetOverlappedResult]."""

    status: Status
    bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.status is Status.SUCCESS


@dataclasses.dataclass
class DeviceDescription:
    """DEVICE_DESCRIPTION for get_dma_adapter (P5).

    ``DeviceDescription.zeroed()`` is the zero-initialised structure the proxy must start
    from; a plain ``DeviceDescription()`` leaves every field uninitialised (None) and is
    refused, as an uninitialised stack structure would be.
    """

    version: int | None = None
    master: bool | None = None
    scatter_gather: bool | None = None
    dma32: bool | None = None
    dma64: bool | None = None
    maximum_length: int | None = None
    interface_type: int | None = None

    @classmethod
    def zeroed(cls) -> DeviceDescription:
        return cls(version=0, master=False, scatter_gather=False, dma32=False, dma64=False,
                   maximum_length=0, interface_type=0)

    def uninitialised(self) -> list[str]:
        """Names of fields never initialised."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is None]


@dataclasses.dataclass(frozen=True)
class Leak:
    """A registration or allocation still alive after the test's sockets were closed (R11)."""

    node: str
    kind: str  # "registration" or "allocation"
    detail: str

    def __str__(self) -> str:
        return f"{self.node}: {self.kind} {self.detail}"

