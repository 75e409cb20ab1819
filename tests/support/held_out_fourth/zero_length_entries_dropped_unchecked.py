"""Zero-length scatter entries are dropped before the post, without looking at their handle.

The bug: some devices fault on a zero-length SGE (Soft-iWARP oopses on one), so the provider removes zero-length
entries from every scatter list before posting it. It drops them before it checks them: a zero-length entry
whose handle is stale, unknown, another socket's, or whose buffer is another process's, is never judged, and the
call goes through. A list of five entries, one of them empty, is no longer "too many buffers" either.

Realistic: the verbs engine's own siw workaround is exactly this filter, done after the checks; done before them
it is this bug.

Breaks R1 (another socket's handle, or another process's buffer, named in a scatter list is accepted), R3 (a
deregistered handle in a zero-length entry is accepted) and R14 (a handle not registered on the socket must
complete LOCAL_PROTECTION with 0 bytes, whichever entry it is in, zero-length included; five entries must be
WSAEINVAL).
"""

from __future__ import annotations

from typing import Any

from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Descriptor, LocalBuffers, PendingOperation, Socket

BREAKS = ("R1", "R3", "R14")


def _non_empty(local_buffers: Any) -> Any:
    if not isinstance(local_buffers, list | tuple):
        return local_buffers
    kept = []
    for pair in local_buffers:
        length = getattr(pair[0], "length", None) if isinstance(pair, tuple | list) and len(pair) == 2 else None
        if type(length) is int and length == 0:
            continue  # the bug: dropped before anything looked at it
        kept.append(pair)
    return kept if len(kept) != len(local_buffers) else local_buffers


class DropsEmptyEntries(DelegatingProvider):
    def rdma_write(self, socket: Socket, local_buffers: LocalBuffers, target_descriptor: Descriptor,
                   offset: int = 0) -> PendingOperation:
        return super().rdma_write(socket, _non_empty(local_buffers), target_descriptor, offset)

    def rdma_read(self, socket: Socket, local_buffers: LocalBuffers, source_descriptor: Descriptor,
                  offset: int = 0) -> PendingOperation:
        return super().rdma_read(socket, _non_empty(local_buffers), source_descriptor, offset)

    def send(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        return super().send(socket, _non_empty(buffers))

    def recv(self, socket: Socket, buffers: LocalBuffers) -> PendingOperation:
        return super().recv(socket, _non_empty(buffers))


pytest_san_make_provider = provider_hook(DropsEmptyEntries)
