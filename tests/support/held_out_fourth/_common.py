"""What several entries of the fourth held-out set share: reading scatter lists and the session's registrations,
and RDMA done by hand (the bytes a buggy provider would let through, moved without the wrapped provider's
checks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_san import Access, Completion, Status
from pytest_san.mutants.wrapping import Finished, Registered, Shared, gather, inside, scatter
from pytest_san.spi.protocols import Buffer, Socket


def peer_of(socket: object) -> Any:
    """The socket at the other end of ``socket``'s connection, where the socket says (the emulator's sockets have
    ``peer``, as a provider knows its QP's remote end); None where it does not."""
    return getattr(socket, "peer", None)


def pairs_of(local_buffers: object) -> list[tuple[Buffer, Any]] | None:
    """The (buffer, handle) pairs of a well-formed scatter list whose buffers have integer ranges; None for any
    other list (the wrapped provider judges it)."""
    if not isinstance(local_buffers, list | tuple):
        return None
    found = []
    for pair in local_buffers:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            return None
        buffer = pair[0]
        try:
            address, length, _ = buffer.address, buffer.length, buffer.process
        except AttributeError:
            return None
        if type(address) is not int or type(length) is not int or length < 0:
            return None
        found.append((buffer, pair[1]))
    return found


def live(shared: Shared, socket: object, key: object, kind: str) -> Registered | None:
    """The live registration the caller knows as ``key`` on ``socket``, or None."""
    if isinstance(key, bytearray):
        key = bytes(key)
    try:
        reg = shared.registered.get((id(socket), key))
    except TypeError:  # an unhashable junk key
        return None
    return reg if reg is not None and reg.kind == kind else None


def windows(shared: Shared, descriptor: object) -> list[Registered]:
    """The live RDMA registrations whose descriptor is ``descriptor``, on any socket."""
    if not isinstance(descriptor, bytes | bytearray):
        return []
    wanted = bytes(descriptor)
    return [reg for (_, key), reg in list(shared.registered.items()) if reg.kind == "rdma" and key == wanted]


def allows(access: object, need: Access) -> bool:
    flags: int = int(access)  # type: ignore[call-overload]  # a live registration's flag: an int or Access
    return (flags & int(need)) == int(need)


def locals_ok(shared: Shared, socket: Socket, pairs: Sequence[tuple[Buffer, Any]], need: Access) -> bool:
    """Every entry is covered by a live register_memory registration of ``socket`` that allows ``need``."""
    for buffer, handle in pairs:
        reg = live(shared, socket, handle, "memory")
        if reg is None or not allows(reg.access, need) or not inside(buffer, reg):
            return False
    return True


def by_hand(kind: str, pairs: Sequence[tuple[Buffer, Any]], target: Registered, offset: int) -> Finished | None:
    """RDMA ``kind`` ("write" or "read") between ``pairs`` and the target registration's memory at ``offset``,
    done here with no check of the target's range: a completed operation, or None if the memory is not there."""
    nbytes = sum(buffer.length for buffer, _ in pairs)
    process = target.buffer.process
    try:
        place = process.buffer_at(target.buffer.address + offset, nbytes)
        if kind == "write":
            place.write(gather(pairs))
        else:
            scatter(pairs, place.read(nbytes))
    except Exception:  # the range is not mapped in the target's process: leave it to the wrapped provider
        return None
    return Finished(Completion(Status.SUCCESS, nbytes))


def rdma_needs(kind: str) -> tuple[Access, Access]:
    """(what the local entries need, what the remote window needs) for RDMA ``kind``."""
    return (Access.READ, Access.WRITE) if kind == "write" else (Access.WRITE, Access.READ)
