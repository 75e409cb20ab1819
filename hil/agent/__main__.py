"""Agent entry point: ``python3 <dir>/hil/agent/__main__.py --engine emulator --host NAME --hash H``.

Answers requests on stdin until stdin closes (the controller, or its SSH connection, went away),
then releases everything it holds and exits. Python 3.9+, standard library (+ pyverbs for verbs).

Before serving it leases what it drives (``lease.py``: an abstract socket held until it exits: the RDMA
device's port for verbs, the host name for the emulator); when another process holds the lease, its hello is
``{"busy": <holder>}`` and it exits with status 4 without serving. An engine that cannot start (no such
device, GID index not set, no pyverbs) makes its hello ``{"failed": <why>}`` (server.py) and it exits with status 5.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the pushed tree: hil/agent, hil/rpc and pytest_san/spi (server.py)

from hil.agent import lease, server  # noqa: E402
from hil.rpc import framing as wire  # noqa: E402

BUSY = 4  # exit status of an agent that found its host leased by another


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest-san-agent")
    parser.add_argument("--engine", choices=("emulator", "verbs"), required=True)
    parser.add_argument("--host", default=os.uname().nodename)
    parser.add_argument("--hash", required=True, help="the content hash the controller pushed")
    parser.add_argument("--options", default="{}", help="engine options as JSON")
    parser.add_argument("--lease", default="{}", help="who leases the host (controller, pid, worker, run) as JSON")
    args = parser.parse_args(argv)
    mine = wire.tree_hash(server.agent_files(ROOT))
    if mine != args.hash:
        # An older (or newer) copy must never answer this controller.
        print(f"agent {ROOT}: content hash {mine} does not match the controller's {args.hash}", file=sys.stderr)
        return 3
    # A verbs agent leases its device; an emulator agent its host name, in the scope of the directory agents
    # are pushed to (san_remote_tmp or /tmp), every user's alike (lease.py).
    options = json.loads(args.options) if args.engine == "verbs" else {}
    held, holder = lease.take(str(ROOT.parent), args.host, json.loads(args.lease), args.engine,
                              options.get("device"), options.get("port"))
    if held is None:
        busy = {"protocol": wire.PROTOCOL_VERSION, "hash": mine, "pid": os.getpid(), "busy": holder}
        sys.stdout.buffer.write(wire.encode({"hello": busy}))
        sys.stdout.buffer.flush()
        return BUSY
    try:
        return server.serve(args.engine, args.host, args.options, mine, sys.stdin.buffer, sys.stdout.buffer)
    finally:
        held.release()  # after the engine released everything: the host is clean for the next holder


if __name__ == "__main__":
    sys.exit(main())
