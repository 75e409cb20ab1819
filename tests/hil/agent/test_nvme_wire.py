"""The bytes of NVMe-oF on RDMA the rogue target reads and writes (hil.agent.nvme.wire), checked against the
layouts of the NVMe-oF specification and the kernel's include/linux/nvme.h, built here by hand."""

from __future__ import annotations

import struct

import pytest

from hil.agent.nvme import wire


def connect_sqe(address: int, length: int, key: int, kind: int, command_id: int = 0x1234) -> bytes:
    sqe = bytearray(64)
    sqe[0] = 0x7F  # Fabrics
    struct.pack_into("<H", sqe, 2, command_id)
    sqe[4] = 0x01  # Connect
    struct.pack_into("<Q", sqe, 24, address)
    sqe[32:35] = length.to_bytes(3, "little")
    struct.pack_into("<I", sqe, 35, key)
    sqe[39] = kind
    return bytes(sqe)


def test_a_connect_capsule_with_a_keyed_sgl_gives_address_length_and_key() -> None:
    command = wire.parse_command(connect_sqe(0xFFFF8881_2345_6400, 1024, 0xABCDEF12, 0x4F) + b"in-capsule")
    assert (command.opcode, command.fctype, command.command_id, command.name) == (0x7F, 0x01, 0x1234, "Connect")
    assert command.sgl == wire.KeyedSgl(0xFFFF8881_2345_6400, 1024, 0xABCDEF12, 0xF)
    assert command.sgl.asks_invalidate and len(command.raw) == 64


def test_a_global_key_asks_no_invalidation_and_a_null_sgl_is_none() -> None:
    assert not wire.parse_command(connect_sqe(1, 4096, 7, 0x40)).sgl.asks_invalidate  # type: ignore[union-attr]
    property_get = bytearray(connect_sqe(0, 0, 0, 0x00))
    property_get[4] = 0x04
    command = wire.parse_command(bytes(property_get))
    assert command.sgl is None and command.name == "Property Get"


def test_a_short_capsule_is_refused_naming_its_size() -> None:
    with pytest.raises(wire.NotACapsule, match="at least 64 bytes, got 63"):
        wire.parse_command(bytes(63))


def test_a_completion_carries_the_command_id_and_the_status_shifted_past_the_phase_bit() -> None:
    cqe = wire.completion(0x1234, wire.SC_INTERNAL | wire.STATUS_DNR, result=1, sq_id=0, sq_head=3)
    assert len(cqe) == 16
    result, head, sq_id, command_id, status = struct.unpack("<QHHHH", cqe)
    assert (result, head, sq_id, command_id) == (1, 3, 0, 0x1234)
    assert status & 1 == 0 and status >> 1 == 0x4006


def test_the_cm_private_data_both_ways() -> None:
    assert wire.cm_accept(32) == struct.pack("<HH", 0, 32) + bytes(28)
    assert wire.cm_request(struct.pack("<HHHH", 0, 1, 32, 31) + bytes(24)) == {
        "recfmt": 0, "qid": 1, "hrqsize": 32, "hsqsize": 31}
    assert wire.cm_request(b"\x00") == {}


@pytest.mark.parametrize(("address", "length", "expected"), [
    (0x1000_0400, 1024, (0x1000_0800, 64, "past the end")),
    (0x1000_0C00, 1024, (0x1000_0BC0, 64, "before the start")),  # ends on the page's last byte
    (0x1000_0FF0, 16, (0x1000_0FB0, 64, "before the start")),
    (0x1000_0000, 4000, (0x1000_0FA0, 64, "past the end")),
    (0x1000_0000, 4090, (0x1000_0FFA, 6, "past the end")),  # only what the page has left
])
def test_bytes_outside_the_range_stay_inside_its_page(address: int, length: int,
                                                     expected: tuple[int, int, str]) -> None:
    got = wire.outside(address, length)
    assert got == expected
    start, count, _ = got
    assert start // wire.PAGE in {address // wire.PAGE, (address + length - 1) // wire.PAGE}
    assert (start + count - 1) // wire.PAGE == start // wire.PAGE


def test_a_range_of_whole_pages_has_nothing_outside_it_in_its_pages() -> None:
    assert wire.outside(0x2000, 0x2000)[:2] == (0, 0)


def test_the_nqns_of_connect_data() -> None:
    data = bytearray(1024)
    data[256:256 + 9] = b"nqn.sub:1"
    data[512:512 + 10] = b"nqn.host:2"
    assert wire.connect_strings(bytes(data)) == {"subnqn": "nqn.sub:1", "hostnqn": "nqn.host:2"}
    assert wire.connect_strings(b"short") == {}
