"""``san-hil lab``: a Soft-RoCE lab of virtme-ng guests on this machine, booted and torn down by one command.

The guests run a distribution kernel that carries ``rdma_rxe`` (fetched through apt), share the host's root
filesystem read-only (so the host's python3, pyverbs and rdma tools are inside), sit on one Ethernet
segment carried over 127.0.0.1 by a small relay (:mod:`hil.lab.hub`), and are reached over SSH on
forwarded 127.0.0.1 ports with keys made for the lab alone. ``lab up`` writes an inventory that
:func:`hil.inventory.load_inventory` reads; ``lab down`` removes every process and file ``up`` made.

Modules: ``kernel`` (guest kernel cache), ``provider`` (rxe or siw, one per lab), ``modules`` (out-of-tree
modules built for the lab kernel and cached beside it), ``siw`` (siw.ko), ``proxy`` (san_proxy.ko from
``hil.kmod``), ``layout`` (the guests' RAM below and above 4 GiB), ``keys`` (SSH keys, known_hosts), ``hub``
(the Ethernet relay), ``guest`` (vng command line, in-guest init script, console log), ``state`` (state file,
processes), ``lab`` (up / down / status / run). The command line of ``san-hil lab`` is :mod:`hil.cli.lab`.
"""

from __future__ import annotations

__all__ = ["LabError"]


class LabError(Exception):
    """The lab cannot be brought up, or torn down; the message says what to do."""
