"""The lab's RDMA providers: which soft device each guest gets on its lab NIC, and how the inventory names it.

One provider per lab: rxe and siw never share a netdev, because RDMA CM resolves a connection by IP
address and took rxe0 even when siw0 was asked for (LAB.md). A siw lab's guests have no rxe0 at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from hil.lab import LabError

__all__ = ["DEFAULT_PROVIDER", "PROVIDERS", "Provider", "provider"]


@dataclass(frozen=True)
class Provider:
    name: str  # what `--provider` takes
    device: str  # the RDMA device each guest adds on its lab NIC
    gid_index: int  # the GID the inventory names


PROVIDERS: dict[str, Provider] = {
    # Soft-RoCE, rdma_rxe from the lab kernel. GID index 1 is the IPv4-mapped GID of the lab address
    # (index 0 is the link-local one).
    "rxe": Provider("rxe", "rxe0", 1),
    # Soft-iWARP, siw.ko built once for the lab kernel (hil.lab.siw). It has one, MAC-based GID.
    "siw": Provider("siw", "siw0", 0),
}
DEFAULT_PROVIDER = "rxe"


def provider(name: str) -> Provider:
    try:
        return PROVIDERS[name]
    except KeyError:
        raise LabError(f"unknown provider {name!r}: the lab boots {', '.join(PROVIDERS)}") from None
