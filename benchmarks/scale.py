"""How the conformance suite scales over lab hosts with pytest-xdist: ``-n 1`` against ``-n 2``.

Run ``python benchmarks/scale.py`` (``--rounds N``, default 3). It writes an inventory of two
emulator-engine hosts on this machine (``ansible_connection: local``: the agent path without SSH; two
names, so two leases), and runs ``pytest --pyargs pytest_san.scenarios
--san-backend=hil -n N`` for N = 1 and 2, alternating, so both see the same machine load. It prints
each run's wall time (process start to exit, xdist start-up included) and pytest's own session time,
then the speed-up ratio of the medians: time(-n 1) / time(-n 2).

On this machine the hosts, their agents and the workers share the same cores, so the ratio is
a floor: on a lab, agents run on their own hosts and a worker mostly waits for them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hil.inventory import HostConfig, write_inventory

NAMES = ("scaleA", "scaleB")


def run_suite(workers: int, inventory: Path, workdir: Path, index: int) -> tuple[float, float, dict[str, object]]:
    """(wall seconds, pytest's session seconds, the report) of one run with ``-n workers``."""
    report = workdir / f"report-n{workers}-{index}.json"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
            "--pyargs", "pytest_san.scenarios", "--san-backend=hil", f"--san-inventory={inventory}",
            f"--san-report={report}"]
    began = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
    result = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - began
    if result.returncode != 0:
        output = result.stdout[-3000:] + result.stderr[-2000:]
        raise SystemExit(f"-n {workers} failed (exit {result.returncode}):\n{output}")
    match = re.search(r"in ([0-9.]+)s", result.stdout.strip().splitlines()[-1])
    data: dict[str, object] = json.loads(report.read_text())
    return wall, float(match[1]) if match else float("nan"), data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each (alternating); medians are compared")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="san-scale-") as tmp:
        workdir = Path(tmp)
        (workdir / "remote").mkdir()
        hosts = [HostConfig(name=name, host="localhost", connection="local", engine="emulator", loopback=True,
                            extra={"san_remote_tmp": str(workdir / "remote")}) for name in NAMES]
        inventory = write_inventory(workdir / "lab.json", hosts)
        run_suite(1, inventory, workdir, -1)  # warm-up: the agent is pushed once, caches are filled
        times: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
        for index in range(args.rounds):
            for workers in (1, 2):
                wall, session, report = run_suite(workers, inventory, workdir, index)
                leases = report.get("leases", [])
                assert isinstance(leases, list)
                used = sorted(h for lease in leases for h in lease["hosts"])
                times[workers].append((wall, session))
                print(f"round {index + 1}: -n {workers}: wall {wall:6.2f} s, pytest {session:6.2f} s, "
                      f"hosts {', '.join(used)}", flush=True)
    wall1, wall2 = (statistics.median(w for w, _ in times[n]) for n in (1, 2))
    sess1, sess2 = (statistics.median(s for _, s in times[n]) for n in (1, 2))
    print()
    print(f"{'':10} {'-n 1':>8} {'-n 2':>8} {'speed-up':>9}")
    print(f"{'wall':10} {wall1:7.2f}s {wall2:7.2f}s {wall1 / wall2:8.2f}x")
    print(f"{'pytest':10} {sess1:7.2f}s {sess2:7.2f}s {sess1 / sess2:8.2f}x")
    print(f"(medians of {args.rounds} rounds; {os.cpu_count()} CPUs shared by the agents and the workers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
