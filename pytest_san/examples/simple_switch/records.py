"""The simple switch's framing: one byte stream of records per direction, cut into messages anywhere.

A message is a 4-byte header, the count of messages its sender has taken from its receive ring so far (a
running total, not a delta), followed by the next bytes of the sender's record stream; a message with no
bytes after the header only returns that count. A record is a kind byte, an 8-byte body length and the body,
and may span any number of messages: a descriptor of any length, or a large inline send, needs no special
case.
"""

from __future__ import annotations

import enum
import struct

HEADER = struct.Struct("<I")
RECORD = struct.Struct("<BQ")
LENGTH = struct.Struct("<Q")
COUNT_MODULO = 1 << 32


class Kind(enum.IntEnum):
    DATA = 1  # application bytes, inline
    SOURCE_READ = 2  # a large send: its length, then the sender's READ descriptor (the peer reads it)
    SOURCE_WRITE = 3  # a large send: its length (the peer offers a WRITE descriptor for it)
    SINK = 4  # the receiver's WRITE descriptor for the oldest SOURCE_WRITE
    READ_DONE = 5  # the receiver has read the oldest SOURCE_READ
    WRITE_DONE = 6  # the sender has written the oldest SINK


def record(kind: Kind, body: bytes = b"") -> bytes:
    return RECORD.pack(kind, len(body)) + body


def take_records(stream: bytearray) -> list[tuple[Kind, bytes]]:
    """The whole records at the front of ``stream``, removed from it; a partial one stays."""
    found = []
    while len(stream) >= RECORD.size:
        kind, length = RECORD.unpack_from(stream)
        if len(stream) < RECORD.size + length:
            break
        found.append((Kind(kind), bytes(stream[RECORD.size:RECORD.size + length])))
        del stream[:RECORD.size + length]
    return found
