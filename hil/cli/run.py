"""``san-hil run --on HOST [--inventory PATH] -- PYTEST ARGS``: the pytest command run on a lab host, next to its NIC.

Each SPI call of a lab test is one round trip from the controller to an agent: from a machine 20 ms away from
the lab, the suite takes 1.35 times as long. Run there, only the start, the output and the reports cross the long
hop (docs/remote-run.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from hil.cli.arguments import INVENTORY_HELP
from hil.remote_run.arguments import RunError, read_arguments

__all__ = ["add_run_command"]

NO_COMMAND = "give the command to run after --: san-hil run --on HOST [--inventory PATH] -- PYTEST ARGS"
NO_INVENTORY = ("which inventory? give --inventory PATH (or --san-inventory PATH among the pytest arguments): "
                "HOST is one of its hosts")


def _run(args: argparse.Namespace) -> int:
    from hil.remote_run.runner import RunRequest, run_remote

    parser: argparse.ArgumentParser = args.parser
    if not args.extra_args:
        parser.error(NO_COMMAND)
    try:
        arguments = read_arguments(args.extra_args, Path.cwd(), mutants=args.mutants)
        inventory = Path(args.inventory).resolve() if args.inventory else arguments.inventory
        if inventory is None:
            parser.error(NO_INVENTORY)
        env = {"PYTEST_ADDOPTS": os.environ["PYTEST_ADDOPTS"]} if os.environ.get("PYTEST_ADDOPTS") else {}
        request = RunRequest(args.on, inventory, arguments, mutants=args.mutants, requirements=tuple(args.with_),
                             color=sys.stdout.isatty(), cache=Path(args.wheel_cache) if args.wheel_cache else None,
                             env=env, send_keys=args.send_keys)
        outcome = run_remote(request)
        if args.timings:
            Path(args.timings).write_text(json.dumps({"status": outcome.status, "timings": outcome.timings,
                                                      "wheelhouse": outcome.wheelhouse,
                                                      "venv_made": outcome.venv_made}, indent=2) + "\n")
        return outcome.status
    except RunError as exc:
        print(f"san-hil run: {exc}", file=sys.stderr)
        return 1


def add_run_command(commands: Any) -> None:
    parser = commands.add_parser(
        "run", help="run a pytest command (or san-hil mutants) on a lab host of the inventory, next to its NIC, "
                    "and bring its reports back", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--on", required=True, metavar="HOST", help="the inventory's host to run on")
    parser.add_argument("--inventory", default=None, help=f"the lab's inventory (default: the --san-inventory of "
                                                          f"the pytest arguments); {INVENTORY_HELP}")
    parser.add_argument("--mutants", action="store_true",
                        help="run `san-hil mutants` there instead of pytest: what follows -- is its options, "
                             "its --out directory comes back")
    parser.add_argument("--with", dest="with_", action="append", default=[], metavar="REQUIREMENT",
                        help="also install this distribution in the host's venv (a downstream project's own "
                             "dependency; repeatable)")
    parser.add_argument("--send-keys", action="store_true",
                        help="send the inventory's key files for the host's peers with the run (on its stdin, into "
                             "its working directory, mode 0600, removed when it ends), and pin the peers' host keys "
                             "at their addresses as the host sees them: for a lab whose hosts have no keys to each "
                             "other (san-hil lab's guests)")
    parser.add_argument("--wheel-cache", default=None, metavar="DIR",
                        help="where wheelhouses are kept (default: ~/.cache/pytest-san/wheelhouses)")
    parser.add_argument("--timings", default=None, metavar="PATH",
                        help="write what each step took (seconds), and whether the wheelhouse was built and the venv "
                             "made, to this JSON file (benchmarks/remote.py reads it)")
    parser.set_defaults(run=_run, accepts_extra_args=True, parser=parser)
