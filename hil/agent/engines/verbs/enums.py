"""The one import shim for pyverbs enums.

rdma-core 44 (Debian 12's python3-pyverbs) has the flat ``pyverbs.enums``; releases 59 and later
moved the same names to ``pyverbs.libibverbs_enums``. Everything in the verbs engine imports its
IBV_* names from here. Raises ImportError when pyverbs is not importable at all.
"""

from __future__ import annotations

try:  # rdma-core >= 59
    from pyverbs import libibverbs_enums as _e  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # rdma-core 44 .. 58
    from pyverbs import enums as _e  # type: ignore[import-not-found,no-redef,unused-ignore]

SOURCE = _e.__name__


def _get(name: str) -> int:
    return int(getattr(_e, name))


IBV_ACCESS_LOCAL_WRITE = _get("IBV_ACCESS_LOCAL_WRITE")
IBV_ACCESS_REMOTE_WRITE = _get("IBV_ACCESS_REMOTE_WRITE")
IBV_ACCESS_REMOTE_READ = _get("IBV_ACCESS_REMOTE_READ")
IBV_ACCESS_MW_BIND = _get("IBV_ACCESS_MW_BIND")

IBV_QPT_RC = _get("IBV_QPT_RC")
IBV_QPS_RESET = _get("IBV_QPS_RESET")
IBV_QPS_INIT = _get("IBV_QPS_INIT")
IBV_QPS_RTR = _get("IBV_QPS_RTR")
IBV_QPS_RTS = _get("IBV_QPS_RTS")
IBV_QPS_ERR = _get("IBV_QPS_ERR")
IBV_QP_STATE = _get("IBV_QP_STATE")

IBV_WR_RDMA_WRITE = _get("IBV_WR_RDMA_WRITE")
IBV_WR_RDMA_READ = _get("IBV_WR_RDMA_READ")
IBV_WR_SEND = _get("IBV_WR_SEND")
IBV_WR_BIND_MW = _get("IBV_WR_BIND_MW")
IBV_WR_LOCAL_INV = _get("IBV_WR_LOCAL_INV")
IBV_SEND_SIGNALED = _get("IBV_SEND_SIGNALED")

IBV_MW_TYPE_2 = _get("IBV_MW_TYPE_2")
IBV_WC_SUCCESS = _get("IBV_WC_SUCCESS")
IBV_WC_WR_FLUSH_ERR = _get("IBV_WC_WR_FLUSH_ERR")
IBV_PORT_ACTIVE = _get("IBV_PORT_ACTIVE")

# ibv_device_cap_flags: type-2 memory windows (2A: bound to a QP; 2B: also to a QP, remote-invalidatable).
IBV_DEVICE_MEM_WINDOW_TYPE_2A = int(getattr(_e, "IBV_DEVICE_MEM_WINDOW_TYPE_2A", 1 << 23))
IBV_DEVICE_MEM_WINDOW_TYPE_2B = int(getattr(_e, "IBV_DEVICE_MEM_WINDOW_TYPE_2B", 1 << 24))
