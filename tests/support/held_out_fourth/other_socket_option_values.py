"""Legal: the provider's SO_MAX_RDMA_SIZE is 256 KiB and its SO_RDMA_THRESHOLD_SIZE 8000 bytes.

getsockopt checks the socket and the option as before and answers these values; transfers are taken as before
(up to the wrapped provider's own limit, which is larger), so a switch that cuts RDMA into pieces of the size
the option says, and moves by RDMA what is above the threshold it says, works.

Why the contract allows it: CONTRACT.md section 2 names the options and says getsockopt gives "the option's value";
the values are the provider's own (docs/switches.md: "rdma_threshold None or left out: the switch's own, which
for pytest-san's is the provider's SO_RDMA_THRESHOLD_SIZE"; the threshold a connection uses is the one it
declares).
"""

from __future__ import annotations

from pytest_san import SO_MAX_RDMA_SIZE, SO_RDMA_THRESHOLD_SIZE
from pytest_san.mutants.wrapping import DelegatingProvider, provider_hook
from pytest_san.spi.protocols import Socket

VALUES = {SO_MAX_RDMA_SIZE: 256 * 1024, SO_RDMA_THRESHOLD_SIZE: 8000}


class OtherValues(DelegatingProvider):
    def getsockopt(self, socket: Socket, option: int) -> int:
        value = super().getsockopt(socket, option)  # the wrapped provider's checks: socket, option
        return VALUES.get(option, value) if type(option) is int else value


pytest_san_make_provider = provider_hook(OtherValues)
