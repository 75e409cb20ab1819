"""RDMA write bandwidth against message size: the harness (pytest-san's public API on the hil backend)
and ``ib_write_bw`` (perftest, run on the hosts over the transport), and a plot of both side by side.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hil.controller.backend import Agent, HilBackend
from hil.transport import Channel, TransportError
from pytest_san import Access, Status, Switch
from pytest_san.burst import DEPTH, rdma_write_burst

HARNESS_SIZES: tuple[int, ...] = tuple(4 ** k for k in range(6, 12))  # 4 KiB ... 4 MiB
"""Message sizes the harness measures."""

Point = tuple[int, float]  # (message bytes, Gb/s)


class BandwidthError(RuntimeError):
    """A measurement that could not be made; the message says which and why."""


def measure_harness(backend: HilBackend, sizes: Sequence[int] = HARNESS_SIZES, seconds: float = 0.5,
                    depth: int = DEPTH) -> list[Point]:
    """RDMA write bandwidth through the harness: a burst of identical ``rdma_write``s per size.

    The first endpoint writes a registered READ buffer into the second's WRITE descriptor, as a test
    would (``Switch(backend).connect()``: between the first two nodes, i.e. across a verbs pair), with
    :func:`pytest_san.burst.rdma_write_burst`: on a verbs host the agent's process keeps ``depth`` writes
    in flight and reposts each as the previous completes, as ``ib_write_bw`` does, so what is measured is
    the provider on the NIC, not one controller round trip per write. Bursts grow until one lasts about
    ``seconds``; that last one is the measurement (its single round trip included).
    """
    switch = Switch(backend)
    conn = switch.connect()
    a, b = conn.local, conn.remote
    points: list[Point] = []
    try:
        for size in sizes:
            src = a.process.alloc(size)
            src.write(bytes(range(256)) * (min(size, 1 << 16) // 256), offset=0)
            dst = b.process.alloc(size)
            handle = a.provider.register_memory(a.socket, src, Access.READ)
            desc = b.provider.register_rdma_memory(b.socket, dst, Access.WRITE)
            try:
                points.append((size, timed_burst(a, [(src, handle)], desc, size, seconds, depth)))
            finally:
                b.provider.deregister_rdma_memory(b.socket, desc)
                a.provider.deregister_memory(a.socket, handle)
    finally:
        switch.close_all()
    return points


def timed_burst(end: Any, local: Any, desc: bytes, size: int, seconds: float, depth: int = DEPTH) -> float:
    """Gb/s of a burst of ``size``-byte writes from ``end`` that lasts about ``seconds`` (earlier ones warm up)."""
    count = 8
    while True:
        began = time.perf_counter()
        done = rdma_write_burst(end.provider, end.socket, local, desc, count=count, depth=depth).wait(
            timeout=4 * seconds + 120)
        took = time.perf_counter() - began
        if done.status is not Status.SUCCESS or done.bytes != size * count:
            raise BandwidthError(f"a burst of {count} rdma_writes of {size} bytes completed with "
                                 f"{done.status.name}, {done.bytes} bytes")
        if took >= seconds / 2:
            return size * count * 8 / took / 1e9
        count = min(count * 16, max(count * 2, int(count * seconds / max(took, 1e-6))))


# --- ib_write_bw --------------------------------------------------------------------------------------

_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$")


def parse_ib_write_bw(text: str) -> list[Point]:
    """(bytes, average Gb/s) per row of ``ib_write_bw -a --report_gbits`` output."""
    points: list[Point] = []
    for line in text.splitlines():
        match = _ROW.match(line)
        if match:
            points.append((int(match[1]), float(match[4])))
    return points


ITERATIONS = 20
"""Iterations per size of ``ib_write_bw -a``: its default 5000 up to 8 MiB takes hours on emulated guests."""

SWEEP = ("-a", "-n", str(ITERATIONS))
"""What ``ib_write_bw`` measures by default: every size from 2 bytes to 8 MiB."""


def perftest_args(agent: Agent, run: Sequence[str] = SWEEP) -> list[str]:
    """``run`` (sizes and iterations) plus what every run needs: results in Gb/s, ``agent``'s device, and its GID
    or, on iWARP (which connects only through RDMA CM, as the harness does everywhere), ``-R``."""
    args = [*run, "-F", "--report_gbits"]
    if agent.host.device:
        args += ["-d", agent.host.device]
    if "iwarp" in agent.capabilities:
        args.append("-R")
    elif agent.host.gid_index is not None:
        args += ["-x", str(agent.host.gid_index)]
    return args


def address_of(agent: Agent, timeout: float = 20.0) -> str:
    """An IPv4 address of ``agent``'s host on its RDMA netdev (what the ib_write_bw client connects to)."""
    lab = agent.host.extra.get("san_lab_address")
    if lab:
        return str(lab).split("/")[0]
    netdev = agent.host.netdev
    if not netdev and agent.host.device:
        links = agent.transport.run(["rdma", "-j", "link", "show"], timeout=timeout)
        with_netdev = [link for link in _json_list(links.stdout)
                       if link.get("ifname") == agent.host.device and link.get("netdev")]
        netdev = str(with_netdev[0]["netdev"]) if with_netdev else None
    if netdev:
        shown = agent.transport.run(["ip", "-j", "-4", "addr", "show", "dev", netdev], timeout=timeout)
        for link in _json_list(shown.stdout):
            for info in link.get("addr_info", ()):
                if info.get("local"):
                    return str(info["local"])
    if agent.host.host not in ("127.0.0.1", "localhost", "::1"):
        return agent.host.host
    raise BandwidthError(f"{agent.host.name}: no address for ib_write_bw: set san_netdev (or san_lab_address)")


def _json_list(text: str) -> list[dict[str, Any]]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def measure_ib_write_bw(client: Agent, server: Agent, run: Sequence[str] = SWEEP,
                        timeout: float = 180.0) -> list[Point]:
    """``ib_write_bw`` (``run``: ``-a`` by default) from ``client``'s host to ``server``'s, each started over
    its transport."""
    # stdbuf: perftest's stdout is block-buffered into a pipe, so its banner would never arrive.
    argv = ["stdbuf", "-oL", "ib_write_bw", *perftest_args(server, run)]
    try:
        listener: Channel = server.transport.spawn(argv)
    except TransportError as exc:
        raise BandwidthError(f"{server.host.name}: cannot start {' '.join(argv)}: {exc}") from None
    try:
        try:  # the server prints its parameters once its device is open, then waits for the client
            listener.readline(60.0)
        except TransportError as exc:
            raise BandwidthError(f"{server.host.name}: ib_write_bw server did not start: {exc}") from None
        client_argv = ["ib_write_bw", *perftest_args(client, run), address_of(server)]
        for attempt in range(5):  # the listener may need a moment after its banner under TCG
            result = client.transport.run(client_argv, timeout=timeout)
            if result.returncode == 0 or not listener.alive:
                break
            time.sleep(1.0 + attempt)
    finally:
        listener.close(grace=2.0)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip()[-600:]
        raise BandwidthError(f"{client.host.name}: ib_write_bw exited {result.returncode}: {tail}")
    points = parse_ib_write_bw(result.stdout)
    if not points:
        raise BandwidthError(f"{client.host.name}: no results in ib_write_bw's output: {result.stdout[-400:]}")
    return points


def has_ib_write_bw(agent: Agent) -> bool:
    result = agent.transport.run(["sh", "-c", "command -v ib_write_bw"], timeout=20)
    return result.returncode == 0 and bool(result.stdout.strip())


# --- the plot -----------------------------------------------------------------------------------------

Series = Mapping[str, Mapping[str, Sequence[Point]]]
"""{host set: {"harness": points, "ib_write_bw": points}}"""


def plot_bandwidth(series: Series, path: Path) -> bool:
    """Draw ``series`` into ``path`` (PNG): harness left, ib_write_bw right, same log axes.

    False, and no file, when matplotlib is not installed (``pip install 'pytest-san[nightly]'``).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # type: ignore[import-not-found,unused-ignore]
        from matplotlib.figure import Figure  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return False
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself: savefig renders with Agg, no pyplot, no global state
    left, right = figure.subplots(1, 2, sharex=True, sharey=True)  # same axes: compare at a glance
    panels = ((left, "harness", "harness: pytest-san rdma_write bursts on the hosts"),
              (right, "ib_write_bw", "ib_write_bw (perftest, on the hosts)"))
    for axes, key, title in panels:
        drawn = False
        for index, (name, by_tool) in enumerate(series.items()):
            points = sorted(by_tool.get(key, ()))
            if points:  # one colour per host set in both panels
                axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=name,
                          color=f"C{index % 10}")
                drawn = True
        if not drawn:
            axes.text(0.5, 0.5, "not measured", ha="center", va="center", transform=axes.transAxes)
        axes.set_title(title, fontsize=10)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("message size (bytes)")
        axes.grid(True, which="both", alpha=0.3)
        if drawn:
            axes.set_yscale("log")
            axes.legend(fontsize=8)
    left.set_ylabel("RDMA write bandwidth (Gb/s)")
    figure.suptitle("RDMA write bandwidth against message size")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    return True
