"""Which pytest runs ``san-hil nightly`` makes: the host sets of an inventory, and what each set's suite runs.

A self-sufficient host (emulator engine, san_loopback) is a set alone; the other (verbs) hosts go in
pairs, in order, the odd one out paired with its predecessor. A set with verbs hosts runs rsockets' observed
scenarios beside the suite: they need real verbs, and are nightly's, not CI's (CI is over its budget).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hil.controller.leases import self_sufficient
from hil.inventory import HostConfig

__all__ = ["OBSERVED", "SUITE", "HostSet", "host_sets"]

SUITE = "pytest_san.scenarios"
OBSERVED = "pytest_san.observed_scenarios"  # rsockets judged by observation (docs/judging-a-switch.md)


@dataclass(frozen=True)
class HostSet:
    """What one pytest run of the nightly uses: one self-sufficient host, or a pair of verbs hosts."""

    hosts: tuple[HostConfig, ...]

    @property
    def name(self) -> str:
        return "+".join(h.name for h in self.hosts)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def verbs(self) -> bool:
        return any(h.engine == "verbs" for h in self.hosts)

    @property
    def suite(self) -> tuple[str, ...]:
        """The packages its suite run collects: the scenarios, and on verbs hosts rsockets' observed ones."""
        return (SUITE, OBSERVED) if self.verbs else (SUITE,)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._+-]", "_", self.name)


def host_sets(hosts: Sequence[HostConfig]) -> list[HostSet]:
    """Self-sufficient hosts (emulator engine, san_loopback) alone; the other hosts in pairs, in order.

    An odd host out is paired with the host before it, so every host is tested; the two sets share a
    host and are run one after the other.
    """
    sets: list[HostSet] = []
    unpaired: list[HostConfig] = []
    last_pair: HostSet | None = None
    for host in hosts:
        if self_sufficient(host):
            sets.append(HostSet((host,)))
            continue
        unpaired.append(host)
        if len(unpaired) == 2:
            last_pair = HostSet((unpaired[0], unpaired[1]))
            sets.append(last_pair)
            unpaired = []
    if unpaired:
        partner = last_pair.hosts[-1] if last_pair is not None else None
        if partner is None:
            raise ValueError(f"host {unpaired[0].name} (engine {unpaired[0].engine}) needs a partner: a verbs host "
                             "that is not san_loopback runs in a pair, and the selection has no other")
        sets.append(HostSet((partner, unpaired[0])))
    return sets
