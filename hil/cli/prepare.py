"""``san-hil prepare``: check (and where asked, set up) every lab host, and say what is missing."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import hil.kmod
from hil.controller.client import push_agent
from hil.inventory import HostConfig
from hil.transport import TransportError, open_transport

log = logging.getLogger(__name__)


def prepare_host(host: HostConfig, create_rxe: bool = False, timeout: float = 120.0) -> dict[str, Any]:
    """Run the host check on ``host``; a host that cannot be reached is a problem, not an exception."""
    try:
        with open_transport(host) as transport:
            directory, _ = push_agent(transport)
            argv = [*host.python_argv, f"{directory}/hil/agent/hostcheck.py"]
            if host.device:
                argv += ["--device", host.device]
            if host.netdev:
                argv += ["--netdev", host.netdev]
            if host.gid_index is not None:
                argv += ["--gid-index", str(host.gid_index)]
            if create_rxe:
                argv.append("--create-rxe")
            log.debug("%s: running the host check: %s", host.name, " ".join(argv))
            result = transport.run(argv, timeout=timeout)
    except TransportError as exc:
        return {"host": host.name, "problems": [str(exc)], "devices": [], "actions": []}
    if result.returncode:
        return {"host": host.name, "actions": [], "devices": [],
                "problems": [f"host check exited {result.returncode}: {result.stderr.strip()[-500:]}"]}
    report: dict[str, Any] = json.loads(result.stdout)
    report["host"] = host.name
    if host.engine == "emulator":
        # The emulator engine needs no RDMA, pinned memory or pyverbs: reaching the host is enough.
        report["problems"] = []
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['host']}: " + ("ready" if not report["problems"] else "NOT READY")]
    for action in report.get("actions", []):
        lines.append(f"  did: {action}")
    for dev in report.get("devices", []):
        for port in dev["ports"]:
            gids = ", ".join(f"{g['index']}={g['gid']} ({g['type'] or '?'}, {g['netdev'] or '-'})"
                             for g in port["gids"]) or "none"
            lines.append(f"  {dev['name']} port {port['port']}: {port['state']}; GIDs: {gids}")
    for nd in report.get("netdevs", []):
        lines.append(f"  netdev {nd['name']} {nd['mac']} {nd['state']} {' '.join(nd['addresses']) or '-'}")
    if "memlock" in report:
        soft = report["memlock"][0]
        lines.append(f"  memlock: {'unlimited' if soft < 0 else f'{soft >> 10} KiB'}; pyverbs: {report['pyverbs']}")
    if isinstance(report.get("proxy"), dict):
        lines.append(f"  proxy: {proxy_line(report['proxy'])}")
    lines += [f"  missing: {problem}" for problem in report["problems"]]
    return "\n".join(lines)


def proxy_line(proxy: dict[str, Any]) -> str:
    """What drives the proxy on the host: the kernel module, or the agent's userspace stand-in (a legal fallback,
    never a problem)."""
    name, make = "san_proxy", proxy.get("make") or "make -C hil/kmod && insmod hil/kmod/san_proxy.ko"
    if proxy.get("module") != "loaded":
        return f"userspace stand-in ({name} not loaded: {make})"
    if not proxy.get("device"):
        return f"userspace stand-in ({name} is loaded, but /dev/{name} is missing)"
    abi, ours = proxy.get("abi"), hil.kmod.header_abi()
    if abi is None:
        return f"kernel module {name} loaded (its ABI unread: the check runs without access to /dev/{name})"
    if ours is not None and abi != ours:
        return f"kernel module {name} loaded, ABI {abi}, but this pytest-san's is {ours}: rmmod {name}, then {make}"
    return f"kernel module {name} loaded (ABI {abi})"


def prepare(hosts: Sequence[HostConfig], create_rxe: bool = False, as_json: bool = False) -> tuple[int, str]:
    """(exit status, text): 0 when every host is ready."""
    reports = [prepare_host(h, create_rxe) for h in hosts]
    text = json.dumps(reports, indent=2) if as_json else "\n".join(render(r) for r in reports)
    return (1 if any(r["problems"] for r in reports) else 0), text
