"""The one import shim for pyverbs enums.

rdma-core 44 (Debian 12's python3-pyverbs) has the flat ``pyverbs.enums`` and ``pyverbs.cm_enums``;
releases 59 and later moved the same names to ``pyverbs.libibverbs_enums`` and
``pyverbs.librdmacm_enums``. Everything in the verbs engine imports its IBV_* and RDMA_* names from
here. Raises ImportError when pyverbs is not importable at all.
"""

from __future__ import annotations

try:  # rdma-core >= 59
    from pyverbs import libibverbs_enums as _e
except ImportError:  # rdma-core 44 .. 58
    from pyverbs import enums as _e

try:  # rdma-core >= 59
    from pyverbs import librdmacm_enums as _ce
except ImportError:  # rdma-core 44 .. 58
    from pyverbs import cm_enums as _ce

SOURCE = _e.__name__


def _get(name: str) -> int:
    return int(getattr(_e, name))


def _cm(name: str) -> int:
    return int(getattr(_ce, name))


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
IBV_QP_ACCESS_FLAGS = _get("IBV_QP_ACCESS_FLAGS")
IBV_QP_MIN_RNR_TIMER = _get("IBV_QP_MIN_RNR_TIMER")
IBV_QP_TIMEOUT = _get("IBV_QP_TIMEOUT")
IBV_QP_RETRY_CNT = _get("IBV_QP_RETRY_CNT")
IBV_QP_RNR_RETRY = _get("IBV_QP_RNR_RETRY")

IBV_WR_RDMA_WRITE = _get("IBV_WR_RDMA_WRITE")
IBV_WR_RDMA_READ = _get("IBV_WR_RDMA_READ")
IBV_WR_SEND = _get("IBV_WR_SEND")
IBV_WR_BIND_MW = _get("IBV_WR_BIND_MW")
IBV_WR_LOCAL_INV = _get("IBV_WR_LOCAL_INV")
IBV_SEND_SIGNALED = _get("IBV_SEND_SIGNALED")
IBV_SEND_FENCE = _get("IBV_SEND_FENCE")

IBV_MW_TYPE_2 = _get("IBV_MW_TYPE_2")
IBV_WC_SUCCESS = _get("IBV_WC_SUCCESS")
IBV_WC_WR_FLUSH_ERR = _get("IBV_WC_WR_FLUSH_ERR")
IBV_PORT_ACTIVE = _get("IBV_PORT_ACTIVE")

# ibv_device_cap_flags: type-2 memory windows (2A: bound to a QP; 2B: also to a QP, remote-invalidatable).
IBV_DEVICE_MEM_WINDOW_TYPE_2A = int(getattr(_e, "IBV_DEVICE_MEM_WINDOW_TYPE_2A", 1 << 23))
IBV_DEVICE_MEM_WINDOW_TYPE_2B = int(getattr(_e, "IBV_DEVICE_MEM_WINDOW_TYPE_2B", 1 << 24))

# librdmacm: the port space of RC connections, address hints, and the events the engine handles.
RDMA_PS_TCP = _cm("RDMA_PS_TCP")
RAI_PASSIVE = _cm("RAI_PASSIVE")
RDMA_CM_EVENT_ADDR_RESOLVED = _cm("RDMA_CM_EVENT_ADDR_RESOLVED")
RDMA_CM_EVENT_ROUTE_RESOLVED = _cm("RDMA_CM_EVENT_ROUTE_RESOLVED")
RDMA_CM_EVENT_CONNECT_REQUEST = _cm("RDMA_CM_EVENT_CONNECT_REQUEST")
RDMA_CM_EVENT_CONNECT_RESPONSE = _cm("RDMA_CM_EVENT_CONNECT_RESPONSE")
RDMA_CM_EVENT_ESTABLISHED = _cm("RDMA_CM_EVENT_ESTABLISHED")
RDMA_CM_EVENT_DISCONNECTED = _cm("RDMA_CM_EVENT_DISCONNECTED")
RDMA_CM_EVENT_DEVICE_REMOVAL = _cm("RDMA_CM_EVENT_DEVICE_REMOVAL")
RDMA_CM_EVENT_TIMEWAIT_EXIT = _cm("RDMA_CM_EVENT_TIMEWAIT_EXIT")
