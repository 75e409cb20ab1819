"""Agent entry point: ``python3 <dir>/hil/agent/__main__.py --engine emulator --host NAME --hash H``.

Answers requests on stdin until stdin closes (the controller, or its SSH connection, went away),
then releases everything it holds and exits. Python 3.9+, standard library (+ pyverbs for verbs).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the pushed tree: hil/agent and, for the emulator engine, pytest_san

from hil.agent import server, wire  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest-san-agent")
    parser.add_argument("--engine", choices=("emulator", "verbs"), required=True)
    parser.add_argument("--host", default=os.uname().nodename)
    parser.add_argument("--hash", required=True, help="the content hash the controller pushed")
    parser.add_argument("--options", default="{}", help="engine options as JSON")
    args = parser.parse_args(argv)
    mine = wire.tree_hash(server.agent_files(ROOT))
    if mine != args.hash:
        # An older (or newer) copy must never answer this controller.
        print(f"agent {ROOT}: content hash {mine} does not match the controller's {args.hash}", file=sys.stderr)
        return 3
    return server.serve(args.engine, args.host, args.options, mine, sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main())
