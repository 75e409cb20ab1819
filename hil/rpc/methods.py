"""Which methods each kind of remote object answers: the protocol's surface, nothing more.

``OBJECTS``: what the agent answers for each kind of engine object (``hil/agent/dispatch.py``);
``CHILD``: what a verbs engine's child process answers (``hil/agent/engines/verbs/child.py``).
Standard library only, Python 3.9 compatible.
"""

from __future__ import annotations

OBJECTS: dict[str, frozenset[str]] = {
    "engine": frozenset({"hello", "connect_local", "socket_listen", "socket_connect", "peer_closed", "leaks",
                         "reset", "faults", "kernel_reading", "kernel_readings", "end_session"}),
    "node": frozenset({"spawn_process", "default_process", "spawn_observed"}),
    "process": frozenset({"alloc", "read", "write", "buffer_read", "buffer_write", "kill", "alive"}),
    "provider": frozenset({"register_memory", "deregister_memory", "register_rdma_memory", "deregister_rdma_memory",
                           "rdma_write", "rdma_read", "rdma_write_burst", "rdma_read_burst", "send", "recv",
                           "close_socket", "getsockopt", "registrations", "supports_rdma_read"}),
    "proxy": frozenset({"device_flags", "nolowmem", "set_nolowmem", "allocate", "free", "allocate_contiguous",
                        "free_contiguous", "get_dma_adapter", "put_dma_adapter", "live_allocations",
                        "pin", "physical_runs", "compact_memory", "cache_type_of", "pinned_bytes"}),
    "adapter": frozenset({"allocate_common_buffer", "free_common_buffer", "dma32"}),
    "socket": frozenset({"state"}),
    "operation": frozenset({"done", "wait"}),
    "allocation": frozenset({"info"}),
    "observed": frozenset({"describe", "call", "start", "finish", "kernel", "exit", "kill"}),  # hil/agent/rsockets
}

CHILD = frozenset((
    "hello", "alloc", "free", "read", "write",
    "socket_listen", "socket_connect", "socket_state", "socket_peer_closed",
    "register_memory", "deregister_memory", "register_rdma_memory", "deregister_rdma_memory",
    "rdma_write", "rdma_read", "rdma_write_burst", "rdma_read_burst", "send", "recv", "close_socket",
    "getsockopt", "registrations",
    "supports_rdma_read", "op_wait", "op_done", "leaks", "reset", "exit", "kernel_declared",
    "proxy_pin", "proxy_unpin", "proxy_frames",
))
