"""Shrunk sequences of past divergences: every model run replays them first, on any backend.

Each was found by the model (mostly on rxe) and fixed; keeping its steps here keeps the fix checked
wherever the model runs, in both modes. Add a divergence's shrunk steps here once it is fixed.
"""

from __future__ import annotations

import dataclasses

from ..spi.contract import Access
from .steps import Key, Register, Step, Transfer

R, W, RW = int(Access.READ), int(Access.WRITE), int(Access.READWRITE)
JUNK = Key(junk=0x7FFF_FFFF)


@dataclasses.dataclass(frozen=True)
class Regression:
    name: str
    steps: tuple[Step, ...]


REGRESSIONS: tuple[Regression, ...] = (
    # In-process the access flags were checked first (WSAEINVAL), on verbs the buffer's process (WSAEFAULT);
    # the contract allows either, the differential mode does not. Both now refuse the buffer first.
    Regression("another process's buffer and invalid access flags", (
        Register(2, "rdma", (1, 0, 27, 9), 4, reg=1),
    )),
    # The verbs provider let the NIC check a receive's unknown handle, which it does only as a message lands:
    # a message that fits the good entries before it succeeded.
    Regression("a receive with an unknown handle after a good one", (
        Register(1, "memory", (2, 1, 14, 19), R, reg=1),
        Transfer(1, "send", (((2, 1, 26, 4), Key(reg=1)),), op=1),
        Register(0, "memory", (0, 0, 0, 64), RW, reg=2),
        Transfer(0, "recv", (((0, 0, 0, 64), Key(reg=2)), ((0, 1, 0, 26), Key(reg=1))), op=2),
    )),
    # ... and one that does not fit them was written into them before the receive failed.
    Regression("a message into a receive's good entries before an unknown handle", (
        Register(0, "memory", (0, 0, 26, 25), RW, reg=1),
        Register(1, "memory", (2, 1, 0, 40), R, reg=2),
        Transfer(0, "recv", (((0, 0, 42, 4), Key(reg=1)), ((0, 1, 6, 5), JUNK)), op=1),
        Transfer(1, "send", (((2, 1, 9, 5), Key(reg=2)),), op=2),
    )),
    # rxe never retried a send waiting for the peer's receive once a send with an unknown lkey was queued
    # behind it: the peer's receive and the whole queue stayed pending.
    Regression("an unknown handle queued behind a waiting send", (
        Register(3, "memory", (2, 0, 4, 5), R, reg=1),
        Transfer(3, "send", (((2, 0, 6, 1), Key(reg=1)),), op=1),
        Transfer(3, "send", (((2, 0, 7, 2), Key(reg=1)), ((2, 1, 39, 1), JUNK)), op=2),
        Register(2, "memory", (0, 0, 0, 64), W, reg=2),
        Transfer(2, "recv", (((0, 0, 26, 15), Key(reg=2)),), op=3),
    )),
    # On siw the model expected the NIC's answer to handles of another process (unknown-lkey-status) where the
    # verbs provider first refuses a write past the range its own descriptor states (descriptor-checked-first).
    Regression("a write past its descriptor's stated range from handles only the NIC knows are bad", (
        Register(1, "memory", (2, 1, 35, 1), W, reg=1),
        Register(1, "memory", (2, 1, 0, 40), R, reg=2),
        Register(0, "rdma", (0, 1, 19, 18), W, reg=3, size=20),
        Transfer(0, "rdma_write", (((0, 0, 63, 1), Key(reg=1)), ((0, 0, 56, 7), Key(reg=2)),
                                   ((0, 1, 35, 2), Key(junk=1)), ((0, 1, 4, 26), Key(reg=1))),
                 op=1, desc=Key(reg=3), offset=39),
    )),
    # Differential on rxe (seed 3485020155, sequences 64 and 71): too many entries, one of another process; the
    # verbs engine looked at the entries first (WSAEFAULT), the emulator counts them first (WSAEINVAL).
    Regression("more entries than MAX_SGE, one of them another process's", (
        Register(1, "memory", (2, 1, 26, 6), R, reg=1),
        Transfer(2, "send", (((0, 0, 63, 1), Key(junk=0)), ((0, 0, 3, 17), Key(junk=0)), ((0, 0, 0, 40), Key(reg=1)),
                             ((1, 0, 27, 2), Key(junk=0)), ((0, 0, 44, 7), Key(reg=1))), op=1),
    )),
    # Differential on rxe with kernel 6.12 (seed 1, sequence 150): an RDMA write whose source an RDMA read still
    # outstanding on the same connection brings sent the bytes from before the read (a requester may gather a
    # later request first); the verbs provider now fences it behind the read.
    Regression("an RDMA write sourcing what an outstanding RDMA read brings", (
        Register(0, "rdma", (0, 0, 0, 64), RW, reg=1),
        Register(1, "memory", (2, 1, 9, 2), RW, reg=2),
        Transfer(1, "send", (((2, 1, 10, 1), Key(reg=2)), ((2, 1, 10, 1), Key(reg=2))), op=1),
        Transfer(1, "rdma_read", (((2, 1, 9, 2), Key(reg=2)), ((2, 1, 10, 1), Key(reg=2))), op=2,
                 desc=Key(reg=1), offset=44),
        Transfer(1, "rdma_write", (((2, 1, 9, 1), Key(reg=2)), ((2, 1, 10, 1), Key(reg=2)), ((2, 1, 9, 2), Key(reg=2)),
                                   ((2, 1, 10, 1), Key(reg=2))), op=3, desc=Key(reg=1), offset=27),
        Register(0, "memory", (0, 0, 0, 64), RW, reg=3),
        Transfer(0, "recv", (((0, 0, 0, 64), Key(reg=3)),), op=4),
    )),
)
