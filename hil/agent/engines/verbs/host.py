"""The host side of the verbs engine (runs in the agent's main process on a lab host).

* device selection: ``select_device(name)`` -> (device, port) -- the named device or the first with
  an ACTIVE port; ``device_address`` -> (netdev, IPv4 address) the connection manager binds to;
  ``select_gid_index`` -> the given index or the first RoCE v2 IPv4-mapped GID.
  With no device at all this raises ``NoRdmaDevice`` with a plain reason (pyverbs'
  ``get_device_list()`` raises rather than returning [] then);
* ``ChildProcess``: one modelled process = one child OS process running ``child.py`` (its own
  Context/PD/CQ), and a small JSON-lines client for it; ``kill()`` ends it (its registrations
  vanish with it);
* ``PinnedProxy``: the proxy driver's part on a real host -- pinned memory (mmap + mlock),
  physical addresses from /proc/self/pagemap (root only), contiguous memory from hugetlb pages,
  DMA adapters whose common buffers are such contiguous blocks -- with capabilities declared
  only for what this host really gives.

Standard library only at import time (pyverbs is imported lazily, where present); Python 3.9+.

Each part lives in its own module: ``devices.py`` (selection, GIDs, ``pyverbs_python``),
``children.py`` (``ChildProcess``, ``raise_error``), ``proxy.py`` (``PinnedProxy``,
``host_capabilities``) with ``physical.py`` (pagemap); this module names them all in one place.
"""

from __future__ import annotations

from hil.agent.engines.verbs.children import CHILD, ChildFailure, ChildGone, ChildProcess, raise_error
from hil.agent.engines.verbs.devices import (
    SYSFS,
    NoRdmaDevice,
    device_address,
    device_netdevs,
    gid_table,
    list_devices,
    port_states,
    pyverbs_python,
    select_device,
    select_gid_index,
)
from hil.agent.engines.verbs.physical import physical_frames, physical_runs
from hil.agent.engines.verbs.proxy import HUGE_PAGE_SIZE, HostAllocation, HostDmaAdapter, PinnedProxy, host_capabilities

__all__ = [
    "CHILD",
    "HUGE_PAGE_SIZE",
    "SYSFS",
    "ChildFailure",
    "ChildGone",
    "ChildProcess",
    "HostAllocation",
    "HostDmaAdapter",
    "NoRdmaDevice",
    "PinnedProxy",
    "device_address",
    "device_netdevs",
    "gid_table",
    "host_capabilities",
    "list_devices",
    "physical_frames",
    "physical_runs",
    "port_states",
    "pyverbs_python",
    "raise_error",
    "select_device",
    "select_gid_index",
]
