"""What a sequence is made of: SPI calls described symbolically, so one sequence runs on any backend.

A step names processes, buffers and sockets by their index in the run (``p0``, ``b1``, ``s3``) and
handles and descriptors by the register step that returned them (``Key(reg=7)``), never by a value
one backend handed out. So the same steps replay on the emulator and on lab hosts, and a shrinker
may drop any of them: a step that names something no kept step made is skipped.
"""

from __future__ import annotations

import dataclasses

View = tuple[int, int, int, int]
"""(process, buffer, offset, length): a range of one of the run's buffers."""

BUFFER_SIZES = (64, 40)
"""Every process of a run gets one buffer of each size."""

SHAPES = ("range", "empty", "overrun", "unmapped")
"""What a Register step hands the provider: the view, an empty range at its start, the view's start to
one byte past its buffer's last page (into the guard page), or 16 unmapped bytes a page after its buffer."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """The processes of a run (the node each lives on; the node's default process or a spawned one) and
    its three connection slots (pairs of process indices)."""

    nodes: tuple[int, ...]
    spawned: tuple[bool, ...]
    slots: tuple[tuple[int, int], ...] = ((0, 2), (0, 2), (1, 3))

    def describe(self) -> str:
        procs = ", ".join(f"p{i} = {'a process spawned' if spawned else 'the default process'} on node {n}"
                          for i, (n, spawned) in enumerate(zip(self.nodes, self.spawned, strict=True)))
        return f"{procs}; slots {', '.join(f'p{a}-p{b}' for a, b in self.slots)}"


def plan_for(node_count: int) -> Plan:
    """Slots 0 and 1 join the same two processes on two nodes (R2: another socket between the same hosts);
    slot 2 joins two other processes, the second on a third node where there is one."""
    if node_count >= 3:
        return Plan((0, 0, 1, 2), (False, True, False, False))
    if node_count == 2:
        return Plan((0, 0, 1, 1), (False, True, False, True))
    return Plan((0, 0, 0, 0), (False, True, True, True))


@dataclasses.dataclass(frozen=True)
class Key:
    """A handle or descriptor: what register step ``reg`` returned (``cut`` bytes shorter, or ``-cut``
    zero bytes longer, for a malformed descriptor), or a literal ``junk`` value."""

    reg: int | None = None
    junk: int | str | bytes | None = None
    cut: int = 0


@dataclasses.dataclass(frozen=True)
class Register:
    """register_memory (kind "memory") or register_rdma_memory (kind "rdma") on socket ``sock``."""

    sock: int
    kind: str
    view: View
    access: int
    reg: int  # the id later steps use for what this call returns
    shape: str = "range"
    size: int | None = None  # descriptor_size (rdma only)


@dataclasses.dataclass(frozen=True)
class Deregister:
    sock: int
    kind: str
    key: Key


@dataclasses.dataclass(frozen=True)
class Transfer:
    """rdma_write, rdma_read (with ``desc`` and ``offset``), send or recv; ``op`` names the pending operation."""

    sock: int
    kind: str
    entries: tuple[tuple[View, Key], ...]
    op: int
    desc: Key | None = None
    offset: int = 0


@dataclasses.dataclass(frozen=True)
class Scribble:
    """The application writes its own memory (a pattern made from ``seed``)."""

    view: View
    seed: int


@dataclasses.dataclass(frozen=True)
class Close:
    sock: int


@dataclasses.dataclass(frozen=True)
class Getsockopt:
    """getsockopt on socket ``sock`` (a closed one too), through its own node's provider or (``foreign``) its
    peer's, which holds no such socket; ``option`` one of the two, or junk."""

    sock: int
    option: int | str | float
    foreign: bool = False


@dataclasses.dataclass(frozen=True)
class Reconnect:
    """Close what is left of connection slot ``slot`` and connect its processes anew as ``socks``."""

    slot: int
    socks: tuple[int, int]


Step = Register | Deregister | Transfer | Scribble | Close | Getsockopt | Reconnect


def pattern(seed: int, n: int) -> bytes:
    """Distinct, never-zero bytes, so a zero fill or a misplaced copy shows."""
    return bytes((seed * 37 + i * 7) % 251 + 1 for i in range(n))


def initial_bytes(proc: int, buf: int) -> bytes:
    """What buffer ``buf`` of process ``proc`` holds when a sequence starts."""
    return pattern(proc * 2 + buf, BUFFER_SIZES[buf])


# -- rendering (a whole step: kinds.py, by naming.py's Namer) ----------------------------------

def show_view(view: View) -> str:
    p, b, off, n = view
    return f"p{p}/b{b}[{off}:{off + n}]"
