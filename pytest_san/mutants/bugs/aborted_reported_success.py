"""Operations that a close aborts complete SUCCESS (with no bytes) instead of WSA_OPERATION_ABORTED.

Breaks R11 (pending operations complete ABORTED when the socket closes) and R14 (the completion's status).
Realistic: flushed work completions (WR_FLUSH_ERR) filtered out as "not real errors" and turned into empty
successes.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Completion, Status
from ..wrapping import DelegatingProvider, Recoded, provider_hook

BREAKS = ("R11", "R14")


def _success(done: Completion) -> Completion:
    return Completion(Status.SUCCESS, 0) if done.status is Status.ABORTED else done


class AbortedReportedSuccess(DelegatingProvider):
    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return Recoded(super().rdma_write(socket, local_buffers, target_descriptor, offset), _success)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return Recoded(super().rdma_read(socket, local_buffers, source_descriptor, offset), _success)

    def send(self, socket: Any, buffers: Any) -> Any:
        return Recoded(super().send(socket, buffers), _success)

    def recv(self, socket: Any, buffers: Any) -> Any:
        return Recoded(super().recv(socket, buffers), _success)


pytest_san_make_provider = provider_hook(AbortedReportedSuccess)
