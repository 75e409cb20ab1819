"""The bytes of NVMe over Fabrics on RDMA that a target sees and sends (NVMe-oF 1.1, section 7.3 for RDMA; the
kernel's include/linux/nvme.h and nvme-rdma.h). Standard library only, Python 3.9+.

A command capsule is a 64-byte submission queue entry (SQE). A Fabrics command has opcode 0x7F and its type in
byte 4 (Connect 0x01, Property Get 0x04, Property Set 0x00). Its data pointer (bytes 24..39) is an SGL data block
descriptor; a *keyed* one (type 0x4 in the high nibble of byte 39) carries the host memory's address (8 bytes),
length (3 bytes) and remote key (4 bytes), all little-endian: what a target may RDMA-read or -write. A low nibble
of 0xF asks the target to invalidate the key when it answers ("send with invalidate").

A response capsule is a 16-byte completion queue entry (CQE): result (8), SQ head (2), SQ id (2), command id (2),
status (2, the phase bit 0 and the status code shifted left by one).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SQE_SIZE = 64
CQE_SIZE = 16
FABRICS = 0x7F
CONNECT, PROPERTY_GET, PROPERTY_SET = 0x01, 0x04, 0x00
KEYED_DATA_BLOCK = 0x4  # SGL descriptor type (high nibble of the type byte)
INVALIDATE_KEY = 0xF  # its sub type asking the target to invalidate
STATUS_DNR = 0x4000  # "do not retry", in the status code field
SC_INTERNAL = 0x06
SC_INVALID_FIELD = 0x02
PAGE = 4096
CAP_VALUE = (1 << 37) | (4 << 24) | 31  # CAP: NVM command set, 2 s timeout, 32 entries per queue (0's based)


@dataclass(frozen=True)
class KeyedSgl:
    """A keyed SGL data block descriptor: host memory the target may reach with ``key``."""

    address: int
    length: int
    key: int
    sub_type: int

    @property
    def asks_invalidate(self) -> bool:
        return self.sub_type == INVALIDATE_KEY

    def describe(self) -> dict[str, int]:
        return {"address": self.address, "length": self.length, "key": self.key, "sub_type": self.sub_type}


@dataclass(frozen=True)
class Command:
    opcode: int
    command_id: int
    fctype: int | None  # the Fabrics command type, for opcode 0x7F
    sgl: KeyedSgl | None  # the data pointer, where it is a keyed SGL data block
    raw: bytes

    @property
    def name(self) -> str:
        if self.opcode != FABRICS:
            return f"opcode {self.opcode:#04x}"
        return {CONNECT: "Connect", PROPERTY_GET: "Property Get", PROPERTY_SET: "Property Set"}.get(
            self.fctype or 0, f"Fabrics {self.fctype:#04x}")


class NotACapsule(ValueError):
    """Bytes that are not a command capsule (too short)."""


def parse_command(data: bytes) -> Command:
    """The SQE at the start of ``data`` (a capsule may carry in-capsule data after it)."""
    if len(data) < SQE_SIZE:
        raise NotACapsule(f"a command capsule holds at least {SQE_SIZE} bytes, got {len(data)}")
    opcode, command_id = data[0], struct.unpack_from("<H", data, 2)[0]
    fctype = data[4] if opcode == FABRICS else None
    kind = data[39]
    sgl = None
    if kind >> 4 == KEYED_DATA_BLOCK:
        address = struct.unpack_from("<Q", data, 24)[0]
        length = int.from_bytes(data[32:35], "little")
        key = struct.unpack_from("<I", data, 35)[0]
        sgl = KeyedSgl(address, length, key, kind & 0xF)
    return Command(opcode, command_id, fctype, sgl, bytes(data[:SQE_SIZE]))


def completion(command_id: int, status: int = 0, result: int = 0, sq_id: int = 0, sq_head: int = 0) -> bytes:
    """A CQE answering ``command_id``: ``status`` is the status field's code (with DNR where wanted)."""
    return struct.pack("<QHHHH", result & (2**64 - 1), sq_head, sq_id, command_id, (status << 1) & 0xFFFF)


def cm_accept(crqsize: int) -> bytes:
    """The private data of the target's CM accept (struct nvme_rdma_cm_rep: recfmt 0, the queue size)."""
    return struct.pack("<HH28x", 0, crqsize)


def cm_request(private: bytes) -> dict[str, int]:
    """The host's CM request private data (struct nvme_rdma_cm_req): recfmt, qid, hrqsize, hsqsize."""
    if len(private) < 8:
        return {}
    recfmt, qid, hrqsize, hsqsize = struct.unpack_from("<HHHH", private)
    return {"recfmt": recfmt, "qid": qid, "hrqsize": hrqsize, "hsqsize": hsqsize}


def outside(address: int, length: int, want: int = 64, page: int = PAGE) -> tuple[int, int, str]:
    """Bytes next to [address, address + length) inside the same page, so that reading them never touches an
    address nothing maps: (address, length, "past the end" | "before the start"). Past the end where the page
    has room, else before the start; (0, 0, ...) when the range fills its pages."""
    end = address + length
    room_after = -end % page
    if room_after:
        return end, min(want, room_after), "past the end"
    room_before = address % page
    if room_before:
        take = min(want, room_before)
        return address - take, take, "before the start"
    return 0, 0, "nowhere: the range fills whole pages"


def connect_strings(data: bytes) -> dict[str, str]:
    """The NQNs in Connect's 1024-byte data (host id 16, controller id 2, reserved 238, subsystem NQN 256 at 256,
    host NQN 256 at 512): proof that what was read is the host's Connect data."""
    def text(at: int) -> str:
        return data[at:at + 256].split(b"\0", 1)[0].decode("ascii", "replace")
    return {"subnqn": text(256), "hostnqn": text(512)} if len(data) >= 768 else {}
