"""Contract constants the verbs engine needs, copied from pytest_san (which it must not import).

Values are the contract's (SPEC.md section 2): Access flags, completion statuses (= ibv_wc_status
numbers), Winsock error codes, the descriptor layout and the proxy's constants.
"""

from __future__ import annotations

import struct

# -- Access [MEM_READ, MEM_WRITE, MEM_READWRITE] -------------------------------------------------
ACCESS_READ = 1
ACCESS_WRITE = 2
ACCESS_READWRITE = 3
VALID_ACCESS = (ACCESS_READ, ACCESS_WRITE, ACCESS_READWRITE)
ACCESS_NAMES = {ACCESS_READ: "READ", ACCESS_WRITE: "WRITE", ACCESS_READWRITE: "READWRITE"}

# -- Completion statuses: the value is the ibv_wc_status number ----------------------------------
STATUS_SUCCESS = 0
STATUS_LOCAL_LENGTH = 1  # IBV_WC_LOC_LEN_ERR
STATUS_LOCAL_PROTECTION = 4  # IBV_WC_LOC_PROT_ERR
STATUS_ABORTED = 5  # IBV_WC_WR_FLUSH_ERR
STATUS_ACCESS_VIOLATION = 10  # IBV_WC_REM_ACCESS_ERR
STATUS_REMOTE_OPERATION = 11  # IBV_WC_REM_OP_ERR
STATUS_CONNECTION_RESET = 12  # IBV_WC_RETRY_EXC_ERR
KNOWN_STATUSES = frozenset((STATUS_SUCCESS, STATUS_LOCAL_LENGTH, STATUS_LOCAL_PROTECTION, STATUS_ABORTED,
                            STATUS_ACCESS_VIOLATION, STATUS_REMOTE_OPERATION, STATUS_CONNECTION_RESET))
STATUS_NAMES = {0: "SUCCESS", 1: "LOCAL_LENGTH", 4: "LOCAL_PROTECTION", 5: "ABORTED", 10: "ACCESS_VIOLATION",
                11: "REMOTE_OPERATION", 12: "CONNECTION_RESET"}


def status_from_wc(wc_status: int) -> int:
    """Map an ibv_wc_status onto the contract: statuses it does not name become REMOTE_OPERATION."""
    return wc_status if wc_status in KNOWN_STATUSES else STATUS_REMOTE_OPERATION


# -- Winsock error codes ---------------------------------------------------------------------------
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
WSA_NAMES = {995: "WSA_OPERATION_ABORTED", 997: "WSA_IO_PENDING", 10014: "WSAEFAULT", 10022: "WSAEINVAL",
             10038: "WSAENOTSOCK", 10045: "WSAEOPNOTSUPP", 10050: "WSAENETDOWN", 10054: "WSAECONNRESET",
             10055: "WSAENOBUFS", 10057: "WSAENOTCONN"}

# -- Socket options, provider limits (the emulator's values) --------------------------------------
SO_MAX_RDMA_SIZE = 0x700D
SO_RDMA_THRESHOLD_SIZE = 0x700E
MAX_SGE = 4
QUEUE_DEPTH = 64
MAX_RDMA_SIZE = 1 << 20
RDMA_THRESHOLD = 16 * 1024

# -- RDMA descriptor: what verbs hands a peer: {address u64, length u64, window rkey u32} ----------
DESCRIPTOR = struct.Struct("<QQI")
DESCRIPTOR_SIZE = DESCRIPTOR.size  # 20

# -- Proxy -----------------------------------------------------------------------------------------
DO_DIRECT_IO = 0x10
PAGE_SIZE = 4096
FOUR_GIB = 1 << 32
HUGE_PAGE_SIZE = 2 << 20
CACHE_NON_CACHED = 0
CACHE_CACHED = 1
CACHE_WRITE_COMBINED = 2
CACHE_TYPES = (CACHE_NON_CACHED, CACHE_CACHED, CACHE_WRITE_COMBINED)
MAX_DESCRIPTION_VERSION = 3


def is_int(value: object) -> bool:
    """An integer as the contract means it: ``True`` and ``1.0`` are not (both compare equal to 1)."""
    return type(value) is int


class SanError(Exception):
    """A refused call: ``code`` is the Winsock error; ``required_size`` is set by the descriptor probe.

    Named like pytest_san.SanError on purpose: the agent's dispatcher carries ``code`` and
    ``required_size`` of an exception of that name to the controller, which rebuilds the real one.
    """

    def __init__(self, code: int, message: str = "", required_size: int | None = None) -> None:
        self.code = int(code)
        self.required_size = required_size
        self.message = message
        text = f'{WSA_NAMES.get(self.code, "WSA?")} ({self.code})'
        if message:
            text += ": " + message
        super().__init__(text)
