"""The backend objects a model run reuses across its sequences: processes, their buffers, the probe.

On a lab host a process is a child OS process with its own verbs context (seconds to start in a slow
VM), so a run makes its processes and buffers once; each sequence only connects fresh sockets and
rewrites the buffers whose bytes differ from the sequence's starting pattern.
"""

from __future__ import annotations

from ..batch import batch
from ..spi.contract import PAGE_SIZE, Access, SanError, WsaError
from ..spi.protocols import Backend, Buffer, Node, Process, Socket
from .steps import BUFFER_SIZES, Plan, View, initial_bytes, plan_for


class World:
    """``backend``'s nodes, the run's processes (as ``plan`` says) and one buffer of each size in each."""

    def __init__(self, backend: Backend, plan: Plan | None = None) -> None:
        self.backend = backend
        self.plan = plan or plan_for(len(backend.nodes))
        self.nodes: list[Node] = [backend.nodes[i] for i in range(max(self.plan.nodes) + 1)]
        self.procs: list[Process] = [self.nodes[n].spawn_process() if spawned else self.nodes[n].default_process
                                     for n, spawned in zip(self.plan.nodes, self.plan.spawned, strict=True)]
        self.bufs: list[list[Buffer]] = [[p.alloc(size) for size in BUFFER_SIZES] for p in self.procs]
        # What the proxies count before the run: the model adds the pins of the live registrations (R12).
        self.baseline = [node.proxy.live_allocations() for node in self.nodes]
        self.data: dict[tuple[int, int], bytes | None] = {key: None for key in self._keys()}
        self.desc_size: int | None = None

    def _keys(self) -> list[tuple[int, int]]:
        return [(p, b) for p in range(len(self.procs)) for b in range(len(BUFFER_SIZES))]

    def fresh_bytes(self) -> None:
        """Every buffer holds what a sequence starts from (rewritten only where it differs, all at once)."""
        stale = [(p, b) for p, b in self._keys() if self.data[p, b] != initial_bytes(p, b)]
        with batch(self.backend) as made:
            writes = [made.call(self.bufs[p][b].write, initial_bytes(p, b)) for p, b in stale]
        for (p, b), wrote in zip(stale, writes, strict=True):
            if wrote.error is not None:
                raise wrote.error
            self.data[p, b] = initial_bytes(p, b)

    def forget_bytes(self) -> None:
        """After a divergence nobody knows what the buffers hold: the next sequence rewrites them all."""
        self.data = {key: None for key in self._keys()}

    def buffer(self, view: View, shape: str = "range") -> Buffer:
        pi, bi, off, n = view
        base = self.bufs[pi][bi]
        if shape == "range":
            return base.view(off, n)
        if shape == "empty":
            return base.view(off, 0)
        proc = self.procs[pi]
        if shape == "overrun":  # into the guard page: the bytes up to the end of the buffer's last page are mapped
            return proc.buffer_at(base.address + off, -(-base.length // PAGE_SIZE) * PAGE_SIZE - off + 1)
        return proc.buffer_at(base.address + base.length + 4096, 16)  # inside the guard page after it

    def address(self, view: View) -> int:
        """Where ``view`` starts in its process's memory."""
        return int(self.bufs[view[0]][view[1]].address) + view[2]

    def pair(self, slot: int) -> tuple[Process, Process]:
        """The processes connection slot ``slot`` joins."""
        a, b = self.plan.slots[slot]
        return self.procs[a], self.procs[b]

    def connect(self, slot: int) -> tuple[Socket, Socket]:
        return self.backend.connect_sockets(*self.pair(slot))

    def probe(self, socket: Socket) -> int:
        """The descriptor size, from the descriptor-size probe (R14): WSAEFAULT carrying the required size.
        ``ProbeRefused`` when the provider answers anything else (the model reports it as a divergence)."""
        if self.desc_size is None:
            proc = self.plan.slots[0][0]
            call = "register_rdma_memory(descriptor_size=0)"
            try:
                got = self.nodes[self.plan.nodes[proc]].provider.register_rdma_memory(
                    socket, self.bufs[proc][0], Access.READ, descriptor_size=0)
            except SanError as exc:
                if exc.code is not WsaError.WSAEFAULT or not isinstance(exc.required_size, int) \
                        or exc.required_size <= 0:
                    raise ProbeRefused(f"{call} raised {exc!r}, expected WSAEFAULT carrying the required size "
                                       "(R14)") from exc
                self.desc_size = exc.required_size
            except Exception as exc:
                raise ProbeRefused(f"{call} raised {exc!r}, expected WSAEFAULT carrying the required size "
                                   "(R14)") from exc
            else:
                raise ProbeRefused(f"{call} returned {got!r:.80}, expected WSAEFAULT carrying the required size "
                                   "(R14)")
        return self.desc_size


class ProbeRefused(Exception):
    """The descriptor-size probe did not answer as R14 says: the model cannot size descriptors."""
