"""RDMA write bandwidth against message size: the harness (pytest-san's public API on the hil backend)
and ``ib_write_bw`` (perftest, run on the hosts over the transport), at the same sizes, and a plot of both
on one axis per host set with their ratio.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hil.controller.backend import Agent, HilBackend
from hil.transport import Channel, CommandResult, TransportError
from pytest_san import Access, Status, Switch
from pytest_san.spi.burst import DEPTH, rdma_write_burst

HARNESS_SIZES: tuple[int, ...] = tuple(2 ** k for k in range(1, 24))  # 2 B ... 8 MiB
"""Message sizes the harness measures: those ``ib_write_bw -a`` measures (SWEEP), so that both are compared at
every size."""

Point = tuple[int, float]  # (message bytes, Gb/s)


class BandwidthError(RuntimeError):
    """A measurement that could not be made; the message says which and why."""


def measure_harness(backend: HilBackend, sizes: Sequence[int] = HARNESS_SIZES, seconds: float = 0.5,
                    depth: int = DEPTH) -> list[Point]:
    """RDMA write bandwidth through the harness: a burst of identical ``rdma_write``s per size.

    The first endpoint writes a registered READ buffer into the second's WRITE descriptor, as a test
    would (``Switch(backend).connect()``: between the first two nodes, i.e. across a verbs pair), with
    :func:`pytest_san.spi.burst.rdma_write_burst`: on a verbs host the agent's process keeps ``depth`` writes
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
    its transport. Under TCG the server may print its banner before it listens, and a client that connects
    too soon ends it: then a new server and client are tried, up to ``PAIRS`` times."""
    result = None
    for pair in range(PAIRS):
        result = _client_against_a_new_server(client, server, run, timeout)
        if result.returncode == 0:
            break
        time.sleep(1.0 + pair)
    assert result is not None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip()[-600:]
        raise BandwidthError(f"{client.host.name}: ib_write_bw exited {result.returncode} ({PAIRS} tries): {tail}")
    points = parse_ib_write_bw(result.stdout)
    if not points:
        raise BandwidthError(f"{client.host.name}: no results in ib_write_bw's output: {result.stdout[-400:]}")
    return points


PAIRS = 3
"""How many times ``measure_ib_write_bw`` starts a server and its client before it gives up."""


def _client_against_a_new_server(client: Agent, server: Agent, run: Sequence[str], timeout: float) -> CommandResult:
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
        return result
    finally:
        listener.close(grace=2.0)


def has_ib_write_bw(agent: Agent) -> bool:
    result = agent.transport.run(["sh", "-c", "command -v ib_write_bw"], timeout=20)
    return result.returncode == 0 and bool(result.stdout.strip())


# --- the plot -----------------------------------------------------------------------------------------

Series = Mapping[str, Mapping[str, Sequence[Point]]]
"""{host set: {"harness": points, "ib_write_bw": points}}"""


def ratios(harness: Sequence[Point], perftest: Sequence[Point]) -> list[tuple[int, float]]:
    """(bytes, harness / ib_write_bw) at every size both measured (and ib_write_bw above 0)."""
    theirs = dict(perftest)
    return [(size, gbps / theirs[size]) for size, gbps in sorted(harness) if theirs.get(size)]


def missing_sizes(harness: Sequence[Point], perftest: Sequence[Point]) -> dict[str, list[int]]:
    """The sizes one tool measured and the other did not: {"harness": [...], "ib_write_bw": [...]}."""
    ours, theirs = {s for s, _ in harness}, {s for s, _ in perftest}
    return {"harness": sorted(theirs - ours), "ib_write_bw": sorted(ours - theirs)}


def size_label(size: float, _position: object = None) -> str:
    """4096 -> "4 KiB": the x axis's tick labels."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size:g} B"


def plot_bandwidth(series: Series, path: Path) -> bool:
    """Draw ``series`` into ``path`` (PNG): one axis per host set, the harness and ib_write_bw on the same log
    axes, and on a second axis at the right their ratio (harness / ib_write_bw) at each size both measured.

    False, and no file, when matplotlib is not installed (``pip install 'pytest-san[nightly]'``).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return False
    names = list(series) or ["(no host set)"]
    figure = Figure(figsize=(10, 3.6 * len(names)), layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself: savefig renders with Agg, no pyplot, no global state
    axes_list = figure.subplots(len(names), 1, squeeze=False)[:, 0]
    for axes, name in zip(axes_list, names, strict=True):
        by_tool = series.get(name, {})
        harness, perftest = sorted(by_tool.get("harness", ())), sorted(by_tool.get("ib_write_bw", ()))
        lines = []
        for points, label, colour in ((harness, "harness (pytest-san rdma_write bursts)", "C0"),
                                      (perftest, "ib_write_bw (perftest)", "C1")):
            if points:
                lines += axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                                   color=colour, label=label)
        axes.set_xscale("log", base=2)
        axes.set_xticks([2 ** k for k in range(1, 24, 3)])
        axes.xaxis.set_major_formatter(FuncFormatter(size_label))
        axes.set_xlabel("message size")
        axes.set_ylabel("RDMA write (Gb/s)")
        axes.grid(True, which="both", alpha=0.3)
        axes.set_title(f"{name}: RDMA write bandwidth against message size", fontsize=10)
        if not lines:
            axes.text(0.5, 0.5, "not measured", ha="center", va="center", transform=axes.transAxes)
            continue
        axes.set_yscale("log")
        ratio = ratios(harness, perftest)
        if ratio:
            right = axes.twinx()
            lines += right.plot([r[0] for r in ratio], [r[1] for r in ratio], linestyle="--", marker="s",
                                markersize=3, color="C2", label="harness / ib_write_bw (right axis)")
            right.axhline(1.0, color="C2", linewidth=0.8, alpha=0.5)
            right.set_ylabel("harness / ib_write_bw", color="C2")
            right.set_ylim(0, max(1.2, max(r[1] for r in ratio) * 1.15))
            for size, value in ratio[::max(1, len(ratio) // 8)]:  # some values written out, one in ~8
                right.annotate(f"{value:.2f}", (size, value), textcoords="offset points", xytext=(0, 5),
                               ha="center", fontsize=7, color="C2")
        for tool, sizes in missing_sizes(harness, perftest).items():
            if sizes:
                shown = "not measured" if len(sizes) == len(harness or perftest) else \
                    f"not measured at {', '.join(size_label(s) for s in sizes)}"
                lines += axes.plot([], [], " ", label=f"{tool}: {shown}")
        axes.legend(handles=lines, fontsize=8, loc="upper left")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    return True
