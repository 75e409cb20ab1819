"""RDMA write bandwidth (hil/measure/bandwidth.py): ib_write_bw's output parsed, the plot, both tools at the same
sizes, the harness's measurement through the public API, and ib_write_bw run over the transport."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hil.controller.backend import HilBackend
from hil.inventory import HostConfig
from hil.measure import bandwidth
from hil.measure.bandwidth import measure_harness, parse_ib_write_bw, plot_bandwidth

IB_WRITE_BW = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF		Device         : rxe0
 Number of qps   : 1		Transport type : IB
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 2          5000           0.010              0.009  		   0.567890
 4096       5000           2.51               2.47   		   0.075432
 8388608    5000           9.12               9.05   		   0.000135
---------------------------------------------------------------------------------------
"""


def test_parse_ib_write_bw() -> None:
    assert parse_ib_write_bw(IB_WRITE_BW) == [(2, 0.009), (4096, 2.47), (8388608, 9.05)]


def _synthetic() -> dict[str, dict[str, list[tuple[int, float]]]]:
    sizes = [4 ** k for k in range(6, 12)]
    return {
        "node1+node2": {"harness": [(s, min(2.0, s / 2e6)) for s in sizes],
                        "ib_write_bw": [(2 ** k, min(9.0, 2 ** k / 4e5)) for k in range(1, 24)]},
        "node3+node4": {"harness": [(s, min(1.5, s / 3e6)) for s in sizes], "ib_write_bw": []},
    }


def test_plot_bandwidth_on_synthetic_data(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "out" / "bandwidth.png"
    assert plot_bandwidth(_synthetic(), path)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1000, 720)  # one axis per host set, stacked
    empty = tmp_path / "empty.png"
    assert plot_bandwidth({"x": {"harness": [], "ib_write_bw": []}}, empty) and empty.exists()


def test_both_tools_at_the_same_sizes_and_their_ratio() -> None:
    assert tuple(2 ** k for k in range(1, 24)) == bandwidth.HARNESS_SIZES  # what ib_write_bw -a measures
    assert parse_ib_write_bw(IB_WRITE_BW)[0][0] in bandwidth.HARNESS_SIZES
    harness, perftest = [(4096, 1.0), (65536, 3.0), (1 << 20, 2.0)], [(2, 0.5), (4096, 2.0), (65536, 2.0)]
    assert bandwidth.ratios(harness, perftest) == [(4096, 0.5), (65536, 1.5)]
    assert bandwidth.missing_sizes(harness, perftest) == {"harness": [2], "ib_write_bw": [1 << 20]}
    assert [bandwidth.size_label(s) for s in (2, 4096, 1 << 20, 3 << 19)] == ["2 B", "4 KiB", "1 MiB", "1.5 MiB"]


def test_plot_bandwidth_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert plot_bandwidth(_synthetic(), tmp_path / "b.png") is False
    assert not (tmp_path / "b.png").exists()


def test_harness_bandwidth_through_the_public_api(hosts: list[HostConfig]) -> None:
    backend = HilBackend(hosts[:1])
    try:
        points = measure_harness(backend, sizes=(4096, 65536), seconds=0.05, depth=4)
        assert [size for size, _ in points] == [4096, 65536] and all(gbps > 0 for _, gbps in points)
        assert backend.leaks() == []
    finally:
        backend.close()


# --- the command ---------------------------------------------------------------------------------------


FAKE_IB_WRITE_BW = f"""#!/bin/sh
# server: no address argument; client: the last argument is the server's address
case "$*" in
  *127.0.0.1) echo "$*" > "$(dirname "$0")/client-args"; cat <<'OUT'
{IB_WRITE_BW}OUT
  ;;
  *) echo "$*" > "$(dirname "$0")/server-args"; echo " Waiting for client to connect... "; sleep 30 ;;
esac
"""


def _fake_ib_write_bw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    """``script`` as the ``ib_write_bw`` first on PATH (it writes what it was given beside itself)."""
    fake = tmp_path / "bin" / "ib_write_bw"
    fake.parent.mkdir()
    fake.write_text(script)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    return fake


def _local_host(tmp_path: Path) -> HostConfig:
    """One emulator-engine host over the local transport, with a lab address for ib_write_bw to connect to."""
    return HostConfig(name="local1", host="127.0.0.1", connection="local", engine="emulator", loopback=True,
                      python_interpreter=sys.executable, device="rxe0", gid_index=1,
                      extra={"san_remote_tmp": str(tmp_path), "san_lab_address": "127.0.0.1/24"})


def test_ib_write_bw_runs_over_the_transport(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_ib_write_bw(tmp_path, monkeypatch, FAKE_IB_WRITE_BW)
    backend = HilBackend([_local_host(tmp_path)])
    try:
        agent = backend.agents[0]
        assert bandwidth.has_ib_write_bw(agent)
        assert bandwidth.measure_ib_write_bw(agent, agent) == [(2, 0.009), (4096, 2.47), (8388608, 9.05)]
        expected = ["-a", "-n", "20", "-F", "--report_gbits", "-d", "rxe0", "-x", "1"]
        assert (fake.parent / "server-args").read_text().split() == expected
        assert (fake.parent / "client-args").read_text().split()[-3:] == ["-x", "1", "127.0.0.1"]
        # An iWARP host (its agent says so) connects through RDMA CM: -R, and no GID index.
        agent.capabilities = agent.capabilities | {"iwarp"}
        assert bandwidth.measure_ib_write_bw(agent, agent) == [(2, 0.009), (4096, 2.47), (8388608, 9.05)]
        assert (fake.parent / "server-args").read_text().split() == [*expected[:-2], "-R"]
        assert (fake.parent / "client-args").read_text().split()[-2:] == ["-R", "127.0.0.1"]
    finally:
        backend.close()


FLAKY_IB_WRITE_BW = f"""#!/bin/sh
# The first server prints its banner and ends (as one does when a client came too soon); a client finds no
# server to connect to until a second one started.
dir="$(dirname "$0")"
case "$*" in
  *127.0.0.1)
    if [ "$(wc -l < "$dir/servers")" -lt 2 ]; then echo "Couldn't connect to 127.0.0.1:18515" >&2; exit 1; fi
    cat <<'OUT'
{IB_WRITE_BW}OUT
  ;;
  *) echo start >> "$dir/servers"; echo " Waiting for client to connect... "
     if [ "$(wc -l < "$dir/servers")" -eq 1 ]; then exit 1; fi; sleep 30 ;;
esac
"""


def test_ib_write_bw_starts_a_new_server_when_the_first_one_ended(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's lab once read "Couldn't connect" from ib_write_bw's client: under TCG a server may end when its
    client connects before it listens. A new server and client are tried then."""
    fake = _fake_ib_write_bw(tmp_path, monkeypatch, FLAKY_IB_WRITE_BW)
    backend = HilBackend([_local_host(tmp_path)])
    try:
        agent = backend.agents[0]
        assert bandwidth.measure_ib_write_bw(agent, agent) == [(2, 0.009), (4096, 2.47), (8388608, 9.05)]
        assert (fake.parent / "servers").read_text().split() == ["start", "start"]
    finally:
        backend.close()
