"""NOLOWMEM is reported as set, but allocations still come from below 4 GiB.

Breaks P3. Realistic: the proxy reads the boot option once into a variable that its allocation path never
consults.
"""

from __future__ import annotations

from ..wrapping import DelegatingProxy, proxy_hook

BREAKS = ("P3",)


class ProxyNolowmemIgnored(DelegatingProxy):
    @property
    def nolowmem(self) -> bool:
        return bool(self.shared.extra.get(("nolowmem", self.node.name), self.inner.nolowmem))

    def set_nolowmem(self, enabled: bool) -> None:
        self.shared.extra[("nolowmem", self.node.name)] = enabled


pytest_san_make_proxy = proxy_hook(ProxyNolowmemIgnored)
