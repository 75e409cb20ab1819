"""The reference order of an SPI call's checks, and the checks themselves: which of several faults a call reports.

Every provider call checks all of its arguments before it changes anything, and a call with several faults
is refused with the error of one of them. The contract lets a provider choose which (CONTRACT.md, section 4);
pytest-san's two reference implementations, the emulator and the verbs engine, both report the fault that
comes first in ``ORDER``, the table CONTRACT.md prints as "The reference order of checks"
(``pytest_san.contract_table`` renders it). A backend whose nodes follow it declares the capability
``reference_order`` (``REFERENCE_ORDER``), and the model's differential mode then holds it to the table.

Each call's checks run in stages, each needing less than the one before:

1. ``burst``, for the burst extension only: its count and depth;
2. ``socket``: the socket is an open socket of the provider;
3. the objects the caller handed over (``registration_objects``, ``transfer_objects``): is a buffer one, and
   whose is it (a scatter list: its type, its length, each entry's shape and owner);
4. the values (``registration_values``, ``transfer_values``, ``descriptor``, ``option``, ``deregistration``):
   ranges, flags, sizes, the descriptor, the offset; then the provider's state, which the backend looks up
   and passes in: the socket connected, what the device takes, room on the queue, the caller's memory.

A backend calls them in that order (``socket``'s lookup is its own: "an open socket of this provider").
The verbs engine runs stage 3 in the agent, which holds the caller's objects, and stage 4 in the child
process that owns the socket and the device, so no check depends on where it runs. Faults that only the
NIC or the remote side can see (a handle the provider does not know, a window's rkey, bounds and access)
come after every check here: the call returns and its operation completes with an error status.

The agent imports this module on lab hosts (``pytest_san.spi`` is pushed there with the agent).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .contract import (
    DESCRIPTOR_SIZE,
    MAX_SGE,
    SO_MAX_RDMA_SIZE,
    SO_RDMA_THRESHOLD_SIZE,
    Access,
    SanError,
    WsaError,
    is_int,
)

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10: the agent's 3.9 never evaluates the annotation

REFERENCE_ORDER = "reference_order"
"""The capability of a backend whose every node reports the first fault of ``ORDER``."""

T = TypeVar("T")
"""What a backend looks up (a socket, a registration, a mapping): handed back as it is."""


_REGISTER = ("register_memory", "register_rdma_memory")
_RDMA = ("rdma_write", "rdma_read", "rdma_write_burst", "rdma_read_burst")
_TRANSFER = (*_RDMA, "send", "recv")
CALLS = (*_REGISTER, "deregister_memory", "deregister_rdma_memory", *_TRANSFER, "getsockopt", "close_socket")
"""Every SPI call (and the burst extension), in the order CONTRACT.md lists them."""


@dataclasses.dataclass(frozen=True)
class Check:
    """One row of the order: the fault it finds, the answer to it, and the calls that check it."""

    id: str
    fault: str
    answer: str  # a WsaError name or "TypeError"; an error completion's status for the rows after the call
    calls: tuple[str, ...]
    at_call: bool = True  # False: found after the call returned (the operation completes with ``answer``)


CHECKS = (
    Check("burst", "a burst's count or depth is not an integer >= 1", "WSAEINVAL", _RDMA[2:]),
    Check("read", "the provider has no RDMA read (optional: `supports_rdma_read` is false)", "WSAEOPNOTSUPP",
          ("rdma_read", "rdma_read_burst")),
    Check("socket", "the socket is not an open socket of this provider (closed, another's, no socket at all)",
          "WSAENOTSOCK", CALLS),
    Check("buffer.type", "the buffer is no buffer (no .address, .length, .process)", "TypeError", _REGISTER),
    Check("buffer.owner", "the buffer is another process's or another host's", "WSAEFAULT", _REGISTER),
    Check("buffer.range", "the buffer's address or length is not an integer, or its length is negative",
          "WSAEINVAL", _REGISTER),
    Check("buffer.empty", "the buffer is empty", "WSAEFAULT", _REGISTER),
    Check("access", "the access flags are not exactly 1, 2 or 3 (READ, WRITE, READWRITE)", "WSAEINVAL", _REGISTER),
    Check("descriptor_size.type", "descriptor_size is neither an integer nor None", "WSAEINVAL", _REGISTER[1:]),
    Check("descriptor_size.small", "descriptor_size is below the provider's descriptor size (the probe: the error "
          f"carries the size needed; {DESCRIPTOR_SIZE} for pytest-san's)", "WSAEFAULT", _REGISTER[1:]),
    Check("list.type", "the scatter list is not a list or tuple", "TypeError", _TRANSFER),
    Check("list.count", f"the scatter list has more than {MAX_SGE} entries", "WSAEINVAL", _TRANSFER),
    Check("entry.shape", "an entry is not a (buffer, handle) pair, or its buffer is no buffer", "TypeError",
          _TRANSFER),
    Check("entry.owner", "an entry's buffer is another process's or another host's", "WSAEFAULT", _TRANSFER),
    Check("entry.range", "an entry's address or length is not an integer, or its length is negative", "WSAEINVAL",
          _TRANSFER),
    Check("descriptor", "the descriptor is not bytes (or bytearray) of the provider's descriptor size "
          f"({DESCRIPTOR_SIZE} for pytest-san's)", "WSAEINVAL",
          (*_RDMA, "deregister_rdma_memory")),
    Check("offset", "the offset is not an integer", "WSAEINVAL", _RDMA),
    Check("handle", "the handle is not registered on the socket", "WSAEINVAL", ("deregister_memory",)),
    Check("descriptor.registered", "the descriptor is not registered on the socket", "WSAEINVAL",
          ("deregister_rdma_memory",)),
    Check("in_use", "a pending operation uses the registration", "WSAEINVAL",
          ("deregister_memory", "deregister_rdma_memory")),
    Check("option", "the option is not SO_MAX_RDMA_SIZE or SO_RDMA_THRESHOLD_SIZE (as an integer)", "WSAEINVAL",
          ("getsockopt",)),
    Check("connected", "the socket is not connected (listening, in error, its peer gone)", "WSAENOTCONN",
          (*_REGISTER, *_TRANSFER)),
    Check("device", "the device takes fewer entries (its max_sge; for an RDMA read, its max_sge_rd)", "WSAEINVAL",
          _TRANSFER),
    Check("queue", "the send or receive queue is full", "WSAENETDOWN", _TRANSFER),
    Check("buffer.mapped", "the range is not wholly mapped in the caller's address space", "WSAEFAULT", _REGISTER),
    Check("resources", "the proxy or the device cannot pin the memory", "WSAENOBUFS", _REGISTER),
    Check("entry.handle", "an entry's handle is not registered on the socket, lacks the access, or does not cover "
          "the entry", "LOCAL_PROTECTION", _TRANSFER, at_call=False),
    Check("remote", "the descriptor names no live window of the peer with the access and room at the offset",
          "ACCESS_VIOLATION", _RDMA, at_call=False),
)
"""The reference order: every check, in the order it runs. A call checks the rows that name it."""

ORDER: dict[str, tuple[Check, ...]] = {call: tuple(c for c in CHECKS if call in c.calls) for call in CALLS}
"""Each call's checks, in the order they run: a call with several faults gets the answer of the first."""

BY_ID = {check.id: check for check in CHECKS}


def first(call: str, faults: Iterable[str]) -> str:
    """Of ``faults`` (``Check.id`` values of ``call``'s checks), the one ``ORDER`` checks first."""
    ids = [check.id for check in ORDER[call]]
    return min(faults, key=ids.index)


def answer(call: str, fault: str) -> str:
    """What ``call`` answers to ``fault`` alone."""
    check = BY_ID[fault]
    if call not in check.calls:
        raise KeyError(f"{call} does not check {fault}")
    return check.answer


# -- the checks, stage by stage ---------------------------------------------------------------------------


def burst(count: object, depth: object) -> None:
    """Stage 1 of a burst: WSAEINVAL unless ``count`` and ``depth`` are integers >= 1."""
    if type(count) is not int or count < 1 or type(depth) is not int or depth < 1:
        raise SanError(WsaError.WSAEINVAL, f"a burst's count and depth are integers >= 1, got {count!r:.40} and "
                                           f"{depth!r:.40}")


def socket(found: T | None, socket: object, where: str) -> T:
    """Stage 2: ``found``, the backend's open socket that ``socket`` names, or WSAENOTSOCK when it names none."""
    if found is None:
        raise SanError(WsaError.WSAENOTSOCK, f"{socket!r:.80} is not an open socket of {where}")
    return found


def registration_objects(buffer: object, caller: object) -> tuple[Any, Any]:
    """Stage 3 of register_memory and register_rdma_memory: the buffer is a buffer of ``caller`` (its
    process); its (address, length) as they are, for ``registration_values``."""
    duck: Any = buffer  # any object: one without these attributes is the TypeError below
    try:
        address, length, owner = duck.address, duck.length, duck.process
    except AttributeError:
        raise TypeError(f"buffer must be a buffer (.address, .length, .process), got {buffer!r:.80}") from None
    if owner is not caller:
        raise SanError(WsaError.WSAEFAULT, f"buffer is a buffer of pid {getattr(owner, 'pid', owner)!r:.40}, "
                                           f"not in the address space of pid {getattr(caller, 'pid', caller)!r:.40}")
    return address, length


def _is_range(address: Any, length: Any) -> bool:
    """A range of memory: an integer address and an integer length, not negative."""
    return is_int(address) and is_int(length) and length >= 0


_ACCESS = {1: Access.READ, 2: Access.WRITE, 3: Access.READWRITE}


def registration_values(kind: str, address: Any, length: Any, access: object, descriptor_size: object,
                        not_connected: str | None,
                        resolve: Callable[[int, int], tuple[T | None, int]]) -> tuple[int, int, Access, T, int]:
    """Stage 4 of a registration (``kind`` "memory" or "rdma"): the range, the access, the descriptor size
    (rdma), then the provider's state: ``not_connected`` (why the socket is not connected, or None) and
    ``resolve(address, length)``: the caller's memory holding the range and the range's offset in it, the
    memory None when the range is not wholly mapped. (address, length, access, memory, offset)."""
    if not _is_range(address, length):
        raise SanError(WsaError.WSAEINVAL, f"buffer: address and length must be integers, the length not negative, "
                                           f"got {address!r:.40} and {length!r:.40}")
    if length == 0:
        raise SanError(WsaError.WSAEFAULT, "an empty buffer cannot be registered")
    # Exactly the ints (or Access values) 1, 2, 3: True and 1.0 hash like 1 but are no flags.
    flags = _ACCESS.get(access) if type(access) is Access or type(access) is int else None
    if flags is None:
        raise SanError(WsaError.WSAEINVAL, f"access flags {access!r:.80} are not READ, WRITE or READWRITE")
    if descriptor_size is not None and kind == "rdma":
        if not is_int(descriptor_size):
            raise SanError(WsaError.WSAEINVAL, f"descriptor_size is an integer or None, got {descriptor_size!r:.80}")
        if descriptor_size < DESCRIPTOR_SIZE:
            raise SanError(WsaError.WSAEFAULT, f"a descriptor needs {DESCRIPTOR_SIZE} bytes, {descriptor_size} "
                                               "offered", required_size=DESCRIPTOR_SIZE)
    if not_connected is not None:
        raise SanError(WsaError.WSAENOTCONN, not_connected)
    memory, offset = resolve(address, length)
    if memory is None:
        raise SanError(WsaError.WSAEFAULT, f"{length} bytes at {address:#x} are not wholly inside the caller's "
                                           "address space")
    return address, length, flags, memory, offset


_RDMA_KINDS = frozenset(_RDMA)


def _list_name(kind: str) -> str:
    return "local_buffers" if kind in _RDMA_KINDS else "buffers"


def transfer_objects(kind: str, buffers: object, caller: object) -> list[tuple[Any, Any, Any]]:
    """Stage 3 of rdma_write, rdma_read (and their bursts), send and recv: the scatter list's type and length,
    each entry's shape, then each entry's owner (``caller``, the socket's process). [(address, length, handle)]
    as they are, for ``transfer_values``."""
    if type(buffers) is not list and type(buffers) is not tuple:
        raise TypeError(f"{_list_name(kind)} must be a list of (buffer, handle) pairs, got {buffers!r:.80}")
    if len(buffers) > MAX_SGE:
        raise SanError(WsaError.WSAEINVAL, f"{len(buffers)} buffers, at most {MAX_SGE}")
    entries = []
    owners = []  # checked once every entry's shape is
    for i, pair in enumerate(buffers):
        # A plain tuple or list of two; a subclass could pretend to be one.
        if (type(pair) is not tuple and type(pair) is not list) or len(pair) != 2:
            raise TypeError(f"{_list_name(kind)}[{i}] is not a (buffer, handle) pair: {pair!r:.80}")
        buffer, handle = pair
        try:
            address, length, owner = buffer.address, buffer.length, buffer.process
        except AttributeError:
            raise TypeError(f"{_list_name(kind)}[{i}] must be a buffer (.address, .length, .process), "
                            f"got {buffer!r:.80}") from None
        entries.append((address, length, handle))
        owners.append(owner)
    for i, owner in enumerate(owners):
        if owner is not caller:
            raise SanError(WsaError.WSAEFAULT, f"{_list_name(kind)}[{i}] is a buffer of pid "
                                               f"{getattr(owner, 'pid', owner)!r:.40}, not in the address space of "
                                               f"pid {getattr(caller, 'pid', caller)!r:.40}")
    return entries


def _is_descriptor(value: object) -> TypeGuard[bytes | bytearray]:
    return isinstance(value, (bytes, bytearray)) and len(value) == DESCRIPTOR_SIZE


def descriptor(value: object) -> bytes:
    """A descriptor's shape: ``DESCRIPTOR_SIZE`` bytes (bytes or bytearray), the size pytest-san's providers chose,
    else WSAEINVAL."""
    if not _is_descriptor(value):
        raise SanError(WsaError.WSAEINVAL, f"a descriptor is {DESCRIPTOR_SIZE} bytes, got {value!r:.60}")
    return bytes(value)


def transfer_values(kind: str, entries: list[tuple[Any, Any, Any]], target: object, offset: object,
                    not_connected: str | None, device: str | None,
                    queue_full: str | None) -> list[tuple[int, int, Any]]:
    """Stage 4 of a transfer: each entry's range, the descriptor (``target``) and offset of an RDMA transfer
    (ignored for send and recv), then the provider's state, each a reason or None: ``not_connected`` (why the
    socket is not connected), ``device`` (why the device cannot take this scatter list) and ``queue_full``.
    [(address, length, handle)] with integer ranges."""
    for i, (address, length, _) in enumerate(entries):
        if not _is_range(address, length):
            raise SanError(WsaError.WSAEINVAL, f"{_list_name(kind)}[{i}]: address and length must be integers, the "
                                               f"length not negative, got {address!r:.40} and {length!r:.40}")
    if kind in _RDMA_KINDS:
        if not _is_descriptor(target):
            raise SanError(WsaError.WSAEINVAL, f"a descriptor is {DESCRIPTOR_SIZE} bytes, got {target!r:.60}")
        if not is_int(offset):
            raise SanError(WsaError.WSAEINVAL, f"offset must be an integer, got {offset!r:.40}")
    if not_connected is not None:
        raise SanError(WsaError.WSAENOTCONN, not_connected)
    if device is not None:
        raise SanError(WsaError.WSAEINVAL, device)
    if queue_full is not None:
        raise SanError(WsaError.WSAENETDOWN, queue_full)
    return entries


class InUse(Protocol):
    """A registration as every backend keeps it: how many pending operations use it."""

    @property
    def in_use(self) -> int: ...


R = TypeVar("R", bound=InUse)
"""A registration a backend looks up: handed back as it is."""


def deregistration(registration: R | None, key: object) -> R:
    """Stage 4 of deregister_memory and deregister_rdma_memory: ``registration``, the socket's registration
    that ``key`` (the handle or descriptor) names (None: none), not in use by a pending operation; else
    WSAEINVAL."""
    if registration is None:
        raise SanError(WsaError.WSAEINVAL, f"{_key(key)} is not registered on the socket")
    if registration.in_use:
        raise SanError(WsaError.WSAEINVAL, f"{_key(key)} is in use by a pending operation")
    return registration


def _key(key: object) -> str:
    return f"descriptor {bytes(key).hex()}" if isinstance(key, (bytes, bytearray)) else f"handle {key!r:.40}"


def option(value: object) -> int:
    """Stage 4 of getsockopt: one of the two options, as an integer (28685.0 equals SO_MAX_RDMA_SIZE but is
    no option); else WSAEINVAL."""
    if is_int(value) and value in (SO_MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE):
        return int(value)
    raise SanError(WsaError.WSAEINVAL, f"unknown socket option {value!r:.80}")
