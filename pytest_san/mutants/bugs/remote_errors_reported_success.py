"""An RDMA operation that fails at the peer or in the connection completes SUCCESS (with no bytes).

Breaks R2, R3, R4, R6, R7 and R8 as the initiator sees them (a refused transfer looks accepted) and R14 (the
completion's status). Realistic: completion handling that reads the byte count of the work completion and never
its status.
"""

from __future__ import annotations

from typing import Any

from ...spi.contract import Completion, Status
from ..wrapping import DelegatingProvider, Recoded, provider_hook

BREAKS = ("R2", "R3", "R4", "R6", "R7", "R8", "R14")


def _success(done: Completion) -> Completion:
    return done if done.status in (Status.SUCCESS, Status.ABORTED) else Completion(Status.SUCCESS, done.bytes)


class RemoteErrorsReportedSuccess(DelegatingProvider):
    def rdma_write(self, socket: Any, local_buffers: Any, target_descriptor: Any, offset: int = 0) -> Any:
        return Recoded(super().rdma_write(socket, local_buffers, target_descriptor, offset), _success)

    def rdma_read(self, socket: Any, local_buffers: Any, source_descriptor: Any, offset: int = 0) -> Any:
        return Recoded(super().rdma_read(socket, local_buffers, source_descriptor, offset), _success)


pytest_san_make_provider = provider_hook(RemoteErrorsReportedSuccess)
