"""The contract's values, in one place: Winsock error codes, completion statuses, access flags, the
proxy's and the provider's constants, ``SanError`` and the value types (completions, device descriptions,
leaks; CONTRACT.md section 2).

Besides pytest-san itself, the hil agent imports this module on lab hosts (``pytest_san.spi`` is pushed there
with the agent), so both sides speak the same values.
Inside the package every one of these names is imported from here; users import them from ``pytest_san``.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the agent imports this module on Python 3.9, which has no TypeGuard
    from typing import TypeGuard


class WsaError(enum.IntEnum):
    """Error codes a SAN provider reports, with their Winsock values."""

    WSA_OPERATION_ABORTED = 995
    WSA_IO_PENDING = 997
    WSAEFAULT = 10014
    WSAEINVAL = 10022
    WSAENOTSOCK = 10038
    WSAEOPNOTSUPP = 10045
    WSAENETDOWN = 10050
    WSAECONNRESET = 10054
    WSAENOBUFS = 10055
    WSAENOTCONN = 10057


class SanError(Exception):
    """A provider or proxy call refused: ``code`` says why, ``message`` adds the detail.

    ``required_size`` is set by the descriptor-too-small probe of
    ``register_rdma_memory`` (WSAEFAULT carrying the size the caller must supply).
    """

    def __init__(self, code: WsaError | int, message: str = "", *, required_size: int | None = None) -> None:
        self.code = WsaError(code)
        self.message = message
        self.required_size = required_size
        text = f"{self.code.name} ({int(self.code)})"
        if message:
            text += f": {message}"
        super().__init__(text)

    def __reduce__(self) -> tuple[object, ...]:
        # Keep pickling (pytest-xdist, the HIL channel) lossless.
        return (_rebuild, (int(self.code), self.args[0], self.required_size, self.message))


def _rebuild(code: int, text: str, required_size: int | None, message: str = "") -> SanError:
    err = SanError(WsaError(code), message, required_size=required_size)
    err.args = (text,)
    return err


class Access(enum.IntFlag):
    """Registration access [MEM_READ, MEM_WRITE, MEM_READWRITE]."""

    READ = 1
    WRITE = 2
    READWRITE = 3


VALID_ACCESS = (Access.READ, Access.WRITE, Access.READWRITE)
"""Every access a registration takes (iterating an IntFlag skips READWRITE, an alias of two bits)."""


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


# -- proxy ---------------------------------------------------------------------------------------------
#: The proxy's device object flag for direct I/O (P1).
DO_DIRECT_IO = 0x10
#: The page size of the proxy's physical memory map.
PAGE_SIZE = 4096
#: The 4 GiB line: low memory lies below it, and NOLOWMEM keeps ordinary allocations above it (P3).
FOUR_GIB = 1 << 32
MAX_DESCRIPTION_VERSION = 3  # DEVICE_DESCRIPTION_VERSION .. DEVICE_DESCRIPTION_VERSION3

# -- provider: socket options, limits, the RDMA descriptor -----------------------------------------------
#: Socket option: the largest RDMA transfer the provider takes (``getsockopt``).
SO_MAX_RDMA_SIZE = 0x700D
#: Socket option: above this size the switch moves data by RDMA, below it in messages (R10).
SO_RDMA_THRESHOLD_SIZE = 0x700E
MAX_SGE = 4
QUEUE_DEPTH = 64
MAX_RDMA_SIZE = 1 << 20
RDMA_THRESHOLD = 16 * 1024
DESCRIPTOR = struct.Struct("<QQI")  # address, length, window rkey: what verbs hands a peer
DESCRIPTOR_SIZE = DESCRIPTOR.size  # 20: what pytest-san's providers chose; any provider chooses its own (the probe)


def is_int(value: object) -> TypeGuard[int]:
    """An integer argument: an int (or an int subclass such as an IntEnum), but not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


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
