"""The verbs engine's kernel workarounds as rows of the table of known differences (pytest_san.known_differences).

Each agent's hello names the workarounds its engine applies on its host (hil/agent/engines/verbs/quirks.py
decides by driver and kernel); ``applied_on`` turns what the run's hosts said into the verdict's entries, one per
workaround with the hosts that apply it. Each row's rule, why and reproducer are its workaround's own
(``Workaround.rule``: the rule the kernel's bug would break without it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hil.agent.engines.verbs.quirks import WORKAROUNDS, Workaround
from pytest_san.deviations import Deviation

__all__ = ["applied_on", "every_workaround", "workaround"]


def _series(version: tuple[int, int] | None) -> str:
    return "" if version is None else f"{version[0]}.{version[1]}"


def kernels(w: Workaround) -> str:
    """Which kernels need it, as quirks.py's ``broken_from`` and ``fixed_in`` say."""
    if w.broken_from is None and w.fixed_in is None:
        return "every kernel tested"
    if w.fixed_in is None:
        return f"kernels from {_series(w.broken_from)}"
    if w.broken_from is None:
        return f"kernels before {_series(w.fixed_in)}"
    return f"kernels from {_series(w.broken_from)} before {_series(w.fixed_in)}"


def workaround(w: Workaround, hosts: Iterable[str] = ()) -> Deviation:
    """``w`` as a row of the table; ``hosts``: where this run applies it."""
    return Deviation.known("workaround", w.name, w.rule, f"the verbs engine on {w.driver} ({kernels(w)})", w.bug,
                           w.does, w.why, w.reproducer, hosts=hosts)


def every_workaround() -> list[Deviation]:
    """Every workaround the engine ships (docs/deviations.md)."""
    return [workaround(w) for w in WORKAROUNDS]


def applied_on(record: Mapping[str, Mapping[str, object]]) -> list[Deviation]:
    """The workarounds applied on the run's hosts: ``record`` is the report's ``"kernel_resources"`` (host ->
    its entry, whose ``"workarounds"`` the host's hello gave), in quirks.py's order. A name this controller does
    not know (an agent of another version) is listed as such, not dropped."""
    hosts: dict[str, list[str]] = {}
    for host, entry in sorted(record.items()):
        names = entry.get("workarounds")
        for name in names if isinstance(names, list) else ():
            hosts.setdefault(str(name), []).append(host)
    known = {w.name: w for w in WORKAROUNDS}
    out = [workaround(w, hosts[w.name]) for w in WORKAROUNDS if w.name in hosts]
    out += [Deviation.known("workaround", name, "R14", "the verbs engine", "(not in this controller's quirks.py)",
                            "(unknown)", "kernel-bug", f"san-hil lab reproduce {name}", hosts=where)
            for name, where in hosts.items() if name not in known]
    return out
