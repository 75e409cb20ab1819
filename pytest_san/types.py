"""Value types of the contract: access flags, completion statuses, proxy constants (SPEC.md section 2)."""

from __future__ import annotations

import dataclasses
import enum

DO_DIRECT_IO = 0x10
SO_MAX_RDMA_SIZE = 0x700D
SO_RDMA_THRESHOLD_SIZE = 0x700E

PAGE_SIZE = 4096
FOUR_GIB = 1 << 32


class Access(enum.IntFlag):
    """Registration access [MEM_READ, MEM_WRITE, MEM_READWRITE]."""

    READ = 1
    WRITE = 2
    READWRITE = 3


class Status(enum.Enum):
    """Completion status; ``verbs`` is the matching ibv_wc_status."""

    SUCCESS = 0
    LOCAL_LENGTH = 1
    LOCAL_PROTECTION = 4
    ABORTED = 5
    ACCESS_VIOLATION = 10
    REMOTE_OPERATION = 11
    CONNECTION_RESET = 12

    @property
    def verbs(self) -> int:
        return int(self.value)

    @classmethod
    def from_verbs(cls, wc_status: int) -> Status:
        """Map an ibv_wc_status; statuses the contract does not name become REMOTE_OPERATION."""
        try:
            return cls(wc_status)
        except ValueError:
            return cls.REMOTE_OPERATION


class CacheType(enum.IntEnum):
    """MEMORY_CACHING_TYPE values used by allocate_contiguous (P4)."""

    NON_CACHED = 0
    CACHED = 1
    WRITE_COMBINED = 2


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


def is_int(value: object) -> bool:
    """An integer argument: an int (or an int subclass such as an IntEnum), but not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)
