"""The switch's session protocol: message framing between the two ends of a connection.

Every message starts with an 8-byte header: type, flags, the credits it returns (receives the
sender reposted since its last message) and the payload length. A payload longer than a message slot holds
(a descriptor is as long as the provider chose) travels in several messages of its kind, each but the last
flagged ``MORE``.
"""

from __future__ import annotations

import dataclasses
import enum
import struct

HEADER = struct.Struct("<BBHI")
LENGTH = struct.Struct("<Q")
MORE = 1
"""Flag: the payload goes on in the next message (which is of the same kind)."""


class Kind(enum.IntEnum):
    DATA = 1  # application bytes, inline
    CREDIT = 2  # only returns credits
    SRC_AVAIL = 3  # a large transfer: length, and (read mode) the sender's READ descriptor
    SINK_AVAIL = 4  # write mode: the receiver's WRITE descriptor
    RD_COMPL = 5  # the receiver finished reading the source
    WR_COMPL = 6  # the sender finished writing the sink


@dataclasses.dataclass(frozen=True)
class Message:
    kind: Kind
    payload: bytes = b""
    credits: int = 0
    flags: int = 0

    def encode(self, credits: int) -> bytes:
        return HEADER.pack(self.kind, self.flags, credits, len(self.payload)) + self.payload

    @classmethod
    def decode(cls, raw: bytes) -> Message:
        kind, flags, credits, length = HEADER.unpack_from(raw)
        payload = raw[HEADER.size:HEADER.size + length]
        if len(payload) != length:
            raise ValueError(f"truncated {Kind(kind).name} message: {len(payload)} of {length} bytes")
        return cls(Kind(kind), payload, credits, flags)


def messages(kind: Kind, payload: bytes, room: int) -> list[Message]:
    """``payload`` as messages of ``kind`` whose payloads hold at most ``room`` bytes each. The payloads the
    switch sends this way are never empty: a length, or a descriptor (a provider's bytes, 1 or more)."""
    parts = [payload[i:i + room] for i in range(0, len(payload), room)]
    return [Message(kind, part, flags=MORE if i < len(parts) - 1 else 0) for i, part in enumerate(parts)]


def src_avail(length: int, descriptor: bytes, room: int) -> list[Message]:
    return messages(Kind.SRC_AVAIL, LENGTH.pack(length) + descriptor, room)
