"""The RDMA device as one verbs process opened it: its Context, its one CQ, and the limits read from it.

Capabilities come from the device, never from its name: max_sge, max_sge_rd (an RDMA read with more
buffers is WSAEINVAL, "too many buffers"), type-2 windows, RDMA reads in flight, the transport.
Standard library + pyverbs, Python 3.9 compatible.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from pyverbs.cq import CQ
from pyverbs.device import Context

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.devices import SYSFS, device_address
from hil.agent.engines.verbs.quirks import applied, driver_of
from hil.agent.engines.verbs.records import CQ_PER_SOCKET
from pytest_san.spi.contract import MAX_SGE, SanError, WsaError

RD_ATOMIC = 4  # RDMA reads in flight each way, at most (the device may allow fewer)


class DeviceContext:
    """Owns the process's verbs Context and CQ (every socket's QP completes on it) and holds the device's
    limits; nothing else of the process.

    ``mw_mode`` is ``"mw2"`` (type-2 memory windows bound to the socket's QP, the contract's mechanism)
    or ``"mr"`` (an MR with remote rights, for a device without type-2 windows: "memory_windows" is not
    claimed). Both keep R2 through the socket's own PD. ``"auto"`` picks mw2 when the device advertises
    type-2 windows. ``address`` is the IP address CM binds to (default: the device's netdev's).
    """

    def __init__(self, device: str, port: int = 1, address: str | None = None, mw_mode: str = "auto",
                 cq_size: int = 4096) -> None:
        self.device = device
        self.port = port
        self.address = address or device_address(device, port)[1]
        self.iwarp = _node_type(device).startswith("4")  # "4: RNIC"
        # Kernel bugs worked around on the kernels quirks.py names (another iWARP device gets siw's two alike:
        # a zero-length SGE moves nothing, and a descriptor's stated access is the provider's own check).
        driver = driver_of(device)
        workarounds = {w.name for w in applied(driver)}
        self.skip_zero_sges = self.iwarp and (driver != "siw" or "siw-zero-length-sge" in workarounds)
        self.check_stated = self.iwarp and (driver != "siw" or "siw-unchecked-remote-access" in workarounds)
        self.complete_zero_rdma = driver != "rxe" or "rxe-zero-length-read" in workarounds
        self.refuse_unknown_lkeys = driver == "rxe" and "rxe-flushed-local-error" in workarounds
        self.no_local_ops_behind = driver == "rxe" and "rxe-local-op-replayed" in workarounds
        self.ctx = Context(name=device)
        try:
            attr = self.ctx.query_device()
            self.max_sge = min(MAX_SGE, int(attr.max_sge))
            self.max_sge_rd = max(1, min(self.max_sge, int(attr.max_sge_rd) or self.max_sge))
            self.max_rd_atomic = max(1, min(RD_ATOMIC, int(attr.max_qp_rd_atom), int(attr.max_qp_init_rd_atom)))
            self.atomic_cap = int(attr.atomic_caps)
            self.max_mr_size = int(attr.max_mr_size)
            cap_flags = int(attr.device_cap_flags)
            has_mw2 = bool(cap_flags & (e.IBV_DEVICE_MEM_WINDOW_TYPE_2A | e.IBV_DEVICE_MEM_WINDOW_TYPE_2B)) \
                and int(attr.max_mw) > 0
            if mw_mode == "auto":
                mw_mode = "mw2" if has_mw2 else "mr"
            if mw_mode not in ("mw2", "mr"):
                raise ValueError(f"mw_mode must be auto, mw2 or mr, got {mw_mode!r}")
            self.mw_mode = mw_mode
            self.device_has_mw2 = has_mw2
            port_attr = self.ctx.query_port(port)
            if int(port_attr.state) != e.IBV_PORT_ACTIVE:
                raise SanError(WsaError.WSAENETDOWN, f"port {port} of {device} is not ACTIVE "
                               f"(state {int(port_attr.state)})")
            self.mtu = int(port_attr.active_mtu)
            self.max_msg_sz = int(port_attr.max_msg_sz)
            self.cq_size = min(int(attr.max_cqe), cq_size)
            self.cq: Any = CQ(self.ctx, self.cq_size)
        except BaseException:
            self.ctx.close()
            raise
        self.max_sockets = max(1, self.cq_size // CQ_PER_SOCKET)

    def hello(self) -> dict[str, Any]:
        """What the device is, as the child's hello reports it."""
        return {"device": self.device, "port": self.port, "address": self.address,
                "transport": "iwarp" if self.iwarp else "ib", "mtu": self.mtu, "mw_mode": self.mw_mode,
                "device_has_mw2": self.device_has_mw2, "max_sge": self.max_sge, "max_sge_rd": self.max_sge_rd,
                "max_rd_atomic": self.max_rd_atomic, "atomic_cap": self.atomic_cap, "enums": e.SOURCE}

    def close(self) -> None:
        for obj in (self.cq, self.ctx):
            with contextlib.suppress(Exception):
                obj.close()


def _node_type(device: str) -> str:
    """The device's node type as sysfs says it ("1: CA" for IB/RoCE, "4: RNIC" for iWARP)."""
    try:
        with open(os.path.join(SYSFS, device, "node_type")) as f:
            return f.read().strip()
    except OSError:
        return ""
