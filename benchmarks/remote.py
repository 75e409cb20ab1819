"""The controller beside the user or beside the NIC, side by side in one run (issue 40, item 3).

Against a running lab (``san-hil lab up --hosts 2 --inventory-out /tmp/lab.yaml``)::

    python benchmarks/remote.py --inventory /tmp/lab.yaml --on lab1 [--delay-ms 20] [--rounds 3] [--cold]
        [--send-keys] [--json out.json] [--check] [-- PYTEST ARGS]

PYTEST ARGS default to the issue's sample: ``--pyargs pytest_san.scenarios --san-sample 4 --san-model-sequences 0``.
Each round runs, one after the other (alternated, so that a slower minute of a loaded machine falls on all three):

* **local, 0 ms**: ``python -m pytest`` here with ``--san-backend=hil --san-inventory=...``;
* **local, D ms**: the same, with ``benchmarks/delay.py`` adding D ms to every controller-to-agent round trip
  (``-p delay``), as a lab host that far from the user adds;
* **remote, D ms**: ``san-hil run --on HOST`` (the controller on the lab host, its agents a lab hop away), its
  SSH connection through a local TCP relay that holds each direction's bytes D/2 ms: the long hop that the start,
  the output and the reports cross.

The remote run's one-off costs are timed apart: before the rounds, one ``san-hil run`` (``--cold``: with a fresh
wheelhouse cache and the host's venvs removed first) builds the wheelhouse and makes the venv, and its steps'
times (``--timings``) are printed; every round's remote run then finds both (caches warm). The verdict compares
the medians: remote at D ms over local at 0 ms, the goal at most ``--goal`` (1.1).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_ARGS = ("--pyargs", "pytest_san.scenarios", "--san-sample", "4", "--san-model-sequences", "0")
KINDS = ("local 0 ms", "local {d} ms", "remote {d} ms")
SUMMARY = re.compile(r"=+ (.*(?:passed|failed|error|skipped|deselected).*) in [\d.]+s")


class DelayRelay:
    """A TCP relay on 127.0.0.1 to ``target``: each direction's bytes leave ``one_way`` s after they arrive."""

    def __init__(self, target: tuple[str, int], one_way: float) -> None:
        self.target, self.one_way = target, one_way
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        threading.Thread(target=self._accept, name="delay relay", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for source, sink in ((client, upstream), (upstream, client)):
                held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
                threading.Thread(target=self._read, args=(source, held), daemon=True).start()
                threading.Thread(target=self._write, args=(sink, held), daemon=True).start()

    def _read(self, source: socket.socket, held: queue.SimpleQueue[tuple[float, bytes]]) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            held.put((time.monotonic() + self.one_way, data))
            if not data:
                return

    def _write(self, sink: socket.socket, held: queue.SimpleQueue[tuple[float, bytes]]) -> None:
        while True:
            due, data = held.get()
            late = due - time.monotonic()
            if late > 0:
                time.sleep(late)
            try:
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.server.close()


def relayed_inventory(inventory: Path, on: str, relay: DelayRelay, where: Path) -> Path:
    """``inventory`` with host ``on`` reached through ``relay`` (its host key known under the relay's address)."""
    import paramiko

    from hil.inventory import load_inventory
    from hil.inventory.writer import write_inventory
    from hil.transport import DEFAULT_KNOWN_HOSTS

    loaded = load_inventory(inventory)
    host = loaded.hosts[on]
    known = paramiko.HostKeys(str(host.known_hosts or DEFAULT_KNOWN_HOSTS))
    name = host.host if host.port == 22 else f"[{host.host}]:{host.port}"
    keys = known.lookup(name)
    relayed_known = paramiko.HostKeys()
    for kind, key in (keys or {}).items():
        relayed_known.add(f"[127.0.0.1]:{relay.port}", kind, key)
    relayed_known.save(str(where / "known_hosts"))
    import dataclasses

    hosts = [dataclasses.replace(h, host="127.0.0.1", port=relay.port, known_hosts=where / "known_hosts")
             if n == on else h for n, h in loaded.hosts.items()]
    return write_inventory(where / "relayed.json", hosts)


def timed(argv: Sequence[str], env: dict[str, str], log: Path) -> tuple[float, int, str]:
    """(wall seconds, exit status, pytest's summary line) of ``argv``, its output kept in ``log``."""
    started = time.monotonic()
    with log.open("w") as out:
        status = subprocess.run(list(argv), env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL).returncode
    took = time.monotonic() - started
    found = SUMMARY.findall(log.read_text(errors="replace"))
    return took, status, found[-1] if found else f"no summary (exit {status}; see {log})"


def remove_venvs(inventory: Path, on: str) -> None:
    """The host's venvs of ``san-hil run`` (this user's), so that the first remote run makes one."""
    from hil.inventory import load_inventory
    from hil.transport import open_transport

    host = load_inventory(inventory).hosts[on]
    with open_transport(host) as transport:
        tmp = transport.remote_tmp
        transport.run(["sh", "-c", f"rm -rf {shlex.quote(tmp)}/pytest-san-venv-u$(id -u)-*"], 300)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    passed = args_list[args_list.index("--") + 1:] if "--" in args_list else list(DEFAULT_ARGS)
    ours = args_list[: args_list.index("--")] if "--" in args_list else args_list
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inventory", required=True, type=Path)
    parser.add_argument("--on", required=True, metavar="HOST")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--goal", type=float, default=1.1)
    parser.add_argument("--cold", action="store_true", help="time the one-off costs from nothing: a fresh "
                                                            "wheelhouse cache, the host's venvs removed")
    parser.add_argument("--wheel-cache", type=Path, default=None, help="san-hil run's wheelhouse cache (default: "
                                                                       "its own; --cold: a fresh one)")
    parser.add_argument("--send-keys", action="store_true", help="san-hil run --send-keys (a san-hil lab's guests "
                                                                  "have no keys to each other)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="exit 1 when the goal is missed")
    args = parser.parse_args(ours)
    inventory = args.inventory.resolve()
    delay = args.delay_ms
    work = Path(tempfile.mkdtemp(prefix="pytest-san-bench-remote-"))
    cache = work / "wheel-cache" if args.cold else args.wheel_cache
    from hil.inventory import load_inventory

    target = load_inventory(inventory).hosts[args.on]
    relay = DelayRelay((target.host, target.port), delay / 2000)
    relayed = relayed_inventory(inventory, args.on, relay, work)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    local = [sys.executable, "-m", "pytest", "-p", "delay", "--san-backend=hil", f"--san-inventory={inventory}",
             *passed]
    remote = [sys.executable, "-m", "hil.cli", "run", "--on", args.on, "--inventory", str(relayed),
              "--timings", str(work / "timings.json"), *(["--wheel-cache", str(cache)] if cache else []),
              *(["--send-keys"] if args.send_keys else []),
              "--", *passed]
    try:
        if args.cold:
            remove_venvs(inventory, args.on)
        took, status, summary = timed(remote, env, work / "one-off.log")
        if status not in (0, 1):  # 1: some test failed, which the rounds show too; anything else: no run
            print(f"the first remote run failed (exit {status}):\n{(work / 'one-off.log').read_text()[-3000:]}")
            return 2
        one_off = json.loads((work / "timings.json").read_text()) if (work / "timings.json").exists() else {}
        steps = one_off.get("timings", {})
        print(f"first remote run: {took:.1f} s ({summary}); wheelhouse {steps.get('wheelhouse', 0):.1f} s "
              f"({one_off.get('wheelhouse', '?')}), venv {steps.get('venv', 0):.1f} s "
              f"({'made' if one_off.get('venv_made') else 'reused'})", flush=True)
        results: dict[str, list[float]] = {kind.format(d=f"{delay:g}"): [] for kind in KINDS}
        summaries: dict[str, str] = {}
        for round_ in range(args.rounds):
            for kind, command, ms in ((KINDS[0], local, 0.0), (KINDS[1], local, delay), (KINDS[2], remote, delay)):
                name = kind.format(d=f"{delay:g}")
                run_env = {**env, "SAN_BENCH_DELAY_MS": f"{ms:g}"}
                took, _, summary = timed(command, run_env, work / f"{name.replace(' ', '-')}-{round_}.log")
                results[name].append(took)
                summaries[name] = summary
                print(f"round {round_ + 1}: {name:>14}: {took:7.1f} s  {summary}", flush=True)
        medians = {name: statistics.median(times) for name, times in results.items()}
        base = medians[KINDS[0]]
        print(f"\n{'':>14}  median    x local 0 ms   ({args.rounds} rounds, alternated)")
        for name, value in medians.items():
            print(f"{name:>14}: {value:7.1f} s  {value / base:5.2f}x   {summaries[name]}")
        ratio = medians[KINDS[2].format(d=f"{delay:g}")] / base
        verdict = "PASS" if ratio <= args.goal else "MISS"
        print(f"remote at {delay:g} ms / local at 0 ms: {ratio:.2f}x (goal <= {args.goal:g}x): {verdict}")
        if args.json:
            args.json.write_text(json.dumps({"delay_ms": delay, "rounds": results, "medians": medians,
                                             "ratio": ratio, "goal": args.goal, "one_off": one_off,
                                             "summaries": summaries, "args": passed}, indent=2) + "\n")
        return 1 if args.check and verdict == "MISS" else 0
    finally:
        relay.close()


if __name__ == "__main__":
    sys.exit(main())
