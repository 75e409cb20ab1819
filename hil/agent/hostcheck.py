"""Host check for ``san-hil prepare``, run on the lab host: RDMA devices, ports, GIDs, netdevs, memlock, and
whether the proxy driver's kernel module (san_proxy, hil/kmod) is loaded or the agent will use its stand-in.

Standard library only (pyroute2 is used for netdevs when the host has it, else ``ip -j``);
Python 3.9+. Prints one JSON object; with ``--create-rxe NETDEV`` it first adds a Soft-RoCE link.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

SYS_IB = Path("/sys/class/infiniband")
MEMLOCK_NEEDED = 64 << 20  # registrations pin memory: the default 8 MiB runs out mid-suite
SYS = Path("/sys")
DEV = Path("/dev")
PROXY = "san_proxy"
# SAN_PROXY_INFO = _IOR(0xD5, 0, struct san_proxy_info) (hil/kmod/san_proxy.h): 64 bytes, the ABI its first __u32.
# Written out here so that the host check stays one standalone file.
PROXY_INFO_SIZE = 64
PROXY_INFO = (2 << 30) | (PROXY_INFO_SIZE << 16) | (0xD5 << 8) | 0


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def devices() -> list[dict[str, Any]]:
    if not SYS_IB.is_dir():
        return []
    found = []
    for dev in sorted(SYS_IB.iterdir()):
        ports = []
        for port in sorted((dev / "ports").iterdir(), key=lambda p: int(p.name)):
            gids = []
            for gid in sorted((port / "gids").iterdir(), key=lambda p: int(p.name)):
                value = _read(gid)
                if value and value != "0000:0000:0000:0000:0000:0000:0000:0000":
                    gids.append({"index": int(gid.name), "gid": value,
                                 "type": _read(port / "gid_attrs" / "types" / gid.name),
                                 "netdev": _read(port / "gid_attrs" / "ndevs" / gid.name)})
            ports.append({"port": int(port.name), "state": _read(port / "state"),
                          "link_layer": _read(port / "link_layer"), "gids": gids})
        found.append({"name": dev.name, "node_type": _read(dev / "node_type"), "ports": ports})
    return found


def netdevs() -> tuple[list[dict[str, Any]], str]:
    try:
        from pyroute2 import IPRoute
    except ImportError:
        return _netdevs_ip(), "ip -j"
    with IPRoute() as ipr:
        addrs: dict[int, list[str]] = {}
        for msg in ipr.get_addr():
            addrs.setdefault(msg["index"], []).append(f"{msg.get_attr('IFA_ADDRESS')}/{msg['prefixlen']}")
        return [{"name": link.get_attr("IFLA_IFNAME"), "mac": link.get_attr("IFLA_ADDRESS"),
                 "state": link.get_attr("IFLA_OPERSTATE"), "addresses": addrs.get(link["index"], [])}
                for link in ipr.get_links()], "pyroute2"


def _netdevs_ip() -> list[dict[str, Any]]:
    if not shutil.which("ip"):
        return []
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=False).stdout
    return [{"name": d.get("ifname"), "mac": d.get("address"), "state": d.get("operstate"),
             "addresses": [f"{a['local']}/{a['prefixlen']}" for a in d.get("addr_info", [])]}
            for d in json.loads(out or "[]")]


def create_rxe(name: str, netdev: str) -> list[str]:
    """``modprobe rdma_rxe; rdma link add NAME type rxe netdev NETDEV``: what was done, or why not."""
    steps: list[str] = []
    for argv in (["modprobe", "rdma_rxe"], ["rdma", "link", "add", name, "type", "rxe", "netdev", netdev]):
        if not shutil.which(argv[0]):
            return [*steps, f"cannot run {argv[0]}: not installed"]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        steps.append(f"{' '.join(argv)}: " + ("ok" if done.returncode == 0 else done.stderr.strip()))
        if done.returncode:
            break
    return steps


def _kmod_dir() -> str:
    """Where the module's sources are: beside this file in a checkout or an installed package, else the
    checkout's relative path."""
    here = Path(__file__).resolve().parents[1] / "kmod"
    return str(here) if (here / "Makefile").is_file() else "hil/kmod"


def proxy_abi(device: Path) -> int | None:
    """The loaded module's ABI (SAN_PROXY_INFO), or None when the device cannot be opened (not root) or asked."""
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = bytearray(PROXY_INFO_SIZE)
        fcntl.ioctl(fd, PROXY_INFO, info, True)
        return int(struct.unpack_from("=I", info)[0])
    except OSError:
        return None
    finally:
        os.close(fd)


def proxy_status(sys_root: Path = SYS, dev_root: Path = DEV) -> dict[str, Any]:
    """The proxy driver's module: loaded or not (/sys/module/san_proxy), its misc device, its ABI, and how to
    build and load it. Not loaded is no problem: the agent then uses its userspace stand-in."""
    loaded = (sys_root / "module" / PROXY).is_dir()
    device = dev_root / PROXY
    registered = (sys_root / "class" / "misc" / PROXY).is_dir()
    there = registered and device.exists()
    folder = _kmod_dir()
    return {"module": "loaded" if loaded else "not loaded", "abi": proxy_abi(device) if loaded and there else None,
            "device": there, "make": f"make -C {folder} && insmod {folder}/{PROXY}.ko"}


def pyverbs_status() -> str:
    try:
        import pyverbs.device  # noqa: F401
    except ImportError as exc:
        return f"missing ({exc}); install python3-pyverbs"
    return "ok"


def check(device: str | None, netdev: str | None, gid_index: int | None, create: bool) -> dict[str, Any]:
    actions: list[str] = []
    if create and netdev and not any(d["name"] == (device or "rxe0") for d in devices()):
        actions = create_rxe(device or "rxe0", netdev)
    devs = devices()
    nets, via = netdevs()
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    problems = []
    if not devs:
        problems.append(f"no RDMA device: {SYS_IB} is "
                        + ("empty" if SYS_IB.is_dir() else "absent (no rdma_rxe or NIC driver loaded)")
                        + ("" if netdev else "; set san_netdev and run with --create-rxe to add Soft-RoCE"))
    chosen = next((d for d in devs if d["name"] == device), None) if device else (devs[0] if devs else None)
    if device and chosen is None and devs:
        problems.append(f"san_device {device} not found; devices: {', '.join(d['name'] for d in devs)}")
    if chosen is not None:
        active = [p for p in chosen["ports"] if p["state"].endswith("ACTIVE")]
        if not active:
            problems.append(f"{chosen['name']}: no ACTIVE port ({', '.join(p['state'] for p in chosen['ports'])})")
        gids = [g for p in chosen["ports"] for g in p["gids"]]
        if gid_index is not None and not any(g["index"] == gid_index for g in gids):
            problems.append(f"{chosen['name']}: san_gid_index {gid_index} has no GID")
    if netdev:
        nd = next((n for n in nets if n["name"] == netdev), None)
        if nd is None:
            problems.append(f"san_netdev {netdev} not found; netdevs: {', '.join(str(n['name']) for n in nets)}")
        elif not nd["addresses"]:
            problems.append(f"san_netdev {netdev} has no address (RoCE needs an IP GID)")
    # root has CAP_IPC_LOCK, which lifts the limit for verbs registrations
    if soft != resource.RLIM_INFINITY and soft < MEMLOCK_NEEDED and os.getuid() != 0:
        problems.append(f"memlock limit {soft >> 10} KiB is below {MEMLOCK_NEEDED >> 20} MiB: raise it "
                        "(limits.conf 'memlock unlimited', or LimitMEMLOCK= for sshd)")
    verbs = pyverbs_status()
    if verbs != "ok":
        problems.append(f"pyverbs {verbs}")
    return {"python": sys.version.split()[0], "uid": os.getuid(), "devices": devs, "netdevs": nets,
            "netdevs_via": via, "memlock": [soft, hard], "pyverbs": verbs, "proxy": proxy_status(),
            "actions": actions, "problems": problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest-san-prepare")
    parser.add_argument("--device")
    parser.add_argument("--netdev")
    parser.add_argument("--gid-index", type=int)
    parser.add_argument("--create-rxe", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(check(args.device, args.netdev, args.gid_index, args.create_rxe)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
