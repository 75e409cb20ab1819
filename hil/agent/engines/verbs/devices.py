"""Which RDMA device, port and GID the verbs engine uses on this host, and which Python has pyverbs.

``select_device(name, port=None)`` -> (device, port): the named device or the first with an ACTIVE
port (that port, when ``port`` is given);
``device_address`` -> the IP address the connection manager binds to: the IPv4 address of the
device's netdev (san_netdev, else the netdev sysfs or ``rdma link`` names for the device);
``select_gid_index`` -> the given index or the first RoCE v2 IPv4-mapped GID (CM picks the GID of a
connection itself: only tools such as ib_write_bw still want one). With no device at all this raises
``NoRdmaDevice`` with a plain reason (pyverbs' ``get_device_list()`` raises rather than returning []
then). ``pyverbs_python`` finds an interpreter that can import pyverbs.

Standard library only at import time (pyverbs is imported lazily, where present); Python 3.9+.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterable

SYSFS = "/sys/class/infiniband"


class NoRdmaDevice(RuntimeError):
    """There is no usable RDMA device on this host; the message says why."""


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def list_devices(sysfs: str = SYSFS) -> list[str]:
    """The RDMA devices of this host, or NoRdmaDevice naming why there are none."""
    if os.path.isdir(sysfs):
        names = sorted(os.listdir(sysfs))
        if names:
            return names
        raise NoRdmaDevice(f"no RDMA device: {sysfs} is empty")
    try:
        from pyverbs.device import get_device_list
    except ImportError:
        raise NoRdmaDevice(f"no RDMA device: {sysfs} is absent") from None
    try:
        devices = get_device_list()  # raises (rather than returning []) when there is none
    except Exception as exc:
        raise NoRdmaDevice(f"no RDMA device: {sysfs} is absent and get_device_list() failed: {exc}") from None
    if not devices:
        raise NoRdmaDevice(f"no RDMA device: {sysfs} is absent and get_device_list() is empty")
    return sorted(d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devices)


def port_states(device: str, sysfs: str = SYSFS) -> dict[int, str]:
    """{port number: state text} of a device, e.g. {1: "4: ACTIVE"}."""
    ports = os.path.join(sysfs, device, "ports")
    out = {}
    if os.path.isdir(ports):
        for name in sorted(os.listdir(ports), key=lambda n: int(n) if n.isdigit() else 0):
            try:
                out[int(name)] = _read(os.path.join(ports, name, "state"))
            except (OSError, ValueError):
                continue
    return out


def select_device(name: str | None = None, sysfs: str = SYSFS, port: int | None = None) -> tuple[str, int]:
    """(device, port): ``name`` (san_device) or the first device with an ACTIVE port; ``port`` (san_port)
    restricts the choice to that port number, which must be ACTIVE."""
    devices = list_devices(sysfs)
    if name is not None:
        if name not in devices:
            raise NoRdmaDevice("RDMA device {!r} not found (this host has {})".format(name, ", ".join(devices)))
        candidates = [name]
    else:
        candidates = devices
    seen = []
    for dev in candidates:
        states = port_states(dev, sysfs)
        for number, state in states.items():
            if (port is None or number == port) and "ACTIVE" in state.upper().split(":")[-1]:
                return dev, number
        seen.append("{} {}".format(dev, states or "(no ports)"))
    wanted = "an ACTIVE port" if port is None else f"port {port} ACTIVE (san_port)"
    raise NoRdmaDevice("no RDMA device with {}: {}".format(wanted, "; ".join(seen)))


def gid_table(device: str, port: int, sysfs: str = SYSFS) -> list[tuple[int, str, str]]:
    """(index, gid as 32 hex digits, type text) of the non-zero GIDs of a port."""
    base = os.path.join(sysfs, device, "ports", str(port))
    out: list[tuple[int, str, str]] = []
    gids = os.path.join(base, "gids")
    if not os.path.isdir(gids):
        return out
    for name in sorted(os.listdir(gids), key=lambda n: int(n) if n.isdigit() else -1):
        if not name.isdigit():
            continue
        try:
            gid = _read(os.path.join(gids, name)).replace(":", "").lower()
        except OSError:  # reading an unset entry of a RoCE table fails with EINVAL
            continue
        if not gid or int(gid, 16) == 0:
            continue
        try:
            kind = _read(os.path.join(base, "gid_attrs", "types", name))
        except OSError:
            kind = ""
        out.append((int(name), gid, kind))
    return out


def select_gid_index(device: str, port: int, given: int | None = None, sysfs: str = SYSFS) -> int:
    """``given`` (san_gid_index) when it names a GID; else the first RoCE v2 IPv4-mapped GID; else 0."""
    table = gid_table(device, port, sysfs)
    if given is not None:
        if table and given not in [i for i, _, _ in table]:
            raise NoRdmaDevice(f"GID index {given} of {device} port {port} is not set "
                               f"(set: {[i for i, _, _ in table]})")
        return given
    v4_mapped = "00000000000000000000ffff"
    for wanted in (lambda g, k: "v2" in k.lower() and g.startswith(v4_mapped),
                   lambda g, k: "v2" in k.lower(),
                   lambda g, k: True):
        for index, gid, kind in table:
            if wanted(gid, kind):
                return index
    return 0


def device_netdevs(device: str, port: int, sysfs: str = SYSFS) -> list[str]:
    """The netdev under a port's first GID (RoCE: gid_attrs/ndevs), the device's ``parent`` (rxe, siw),
    else what ``rdma link`` says; first found first, no duplicates."""
    found: list[str] = []
    ndevs = os.path.join(sysfs, device, "ports", str(port), "gid_attrs", "ndevs")
    if os.path.isdir(ndevs):
        for name in sorted(os.listdir(ndevs), key=lambda n: int(n) if n.isdigit() else -1):
            try:
                found.append(_read(os.path.join(ndevs, name)))
            except OSError:  # an unset entry reads as EINVAL
                continue
            break  # one is enough: a port's GIDs share its netdev (and rxe's table has 1024 entries)
    with contextlib.suppress(OSError):
        found.append(_read(os.path.join(sysfs, device, "parent")))
    if not found:
        try:
            done = subprocess.run(["rdma", "-j", "link", "show"], capture_output=True, timeout=20)
            links = json.loads(done.stdout or b"[]")
        except (OSError, subprocess.SubprocessError, ValueError):
            links = []
        found += [str(link["netdev"]) for link in links if isinstance(link, dict)
                  and link.get("ifname") == device and link.get("port", port) == port and link.get("netdev")]
    return [n for i, n in enumerate(found) if n and n not in found[:i]]


def ipv4_address(netdev: str) -> str | None:
    """The netdev's (primary) IPv4 address, or None."""
    request = struct.pack("256s", netdev.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            answer = fcntl.ioctl(s.fileno(), 0x8915, request)  # SIOCGIFADDR
        except OSError:
            return None
    return socket.inet_ntoa(answer[20:24])


def device_address(device: str, port: int, netdev: str | None = None, sysfs: str = SYSFS) -> tuple[str, str]:
    """(netdev, IPv4 address) the connection manager binds to for this device and port: ``netdev``
    (san_netdev) when given, else the device's own netdev; NoRdmaDevice naming what was looked at."""
    candidates = [netdev] if netdev else device_netdevs(device, port, sysfs)
    for name in candidates:
        address = ipv4_address(name)
        if address:
            return name, address
    if not candidates:
        raise NoRdmaDevice(f"no netdev found for {device} port {port} (sysfs gid_attrs/ndevs, parent, "
                           f"rdma link): set san_netdev")
    raise NoRdmaDevice(f"no IPv4 address on {', '.join(candidates)} (the netdev of {device} port {port}): "
                       "the RDMA connection manager needs one")


def pyverbs_python(candidates: Iterable[str] = ()) -> str | None:
    """An interpreter that can import pyverbs: this one, or the system's /usr/bin/python3."""
    seen = []
    for python in [*list(candidates), sys.executable, "/usr/bin/python3"]:
        if not python or python in seen or not os.path.exists(python):
            continue
        seen.append(python)
        try:
            done = subprocess.run([python, "-c", "import pyverbs.device, pyverbs.mr"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return python
    return None
