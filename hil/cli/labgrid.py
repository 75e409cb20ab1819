"""``san-hil labgrid reap``: release the labgrid places of dead pytest-san runs (``hil.scheduling.reaper``).

Safe to run from cron (every few minutes): it only touches places a pytest-san identity acquired, at least
``--min-age`` seconds ago, whose every host it could check and found without a live agent lease; for each it
cancels the identity's reservation and then releases the place from that identity. Exit status 0, or 1 when a
place could not be checked (a host unreachable: it is left alone), 2 for a usage problem.
"""

from __future__ import annotations

import argparse
import os
import sys

from hil.cli.arguments import INVENTORY_HELP

__all__ = ["add_labgrid_command"]


def _reap(args: argparse.Namespace) -> int:
    from hil.inventory import load_inventory
    from hil.scheduling.config import COORDINATOR_ENV, COORDINATOR_VAR
    from hil.scheduling.coordinator import CoordinatorError, CoordinatorSession
    from hil.scheduling.reaper import reap

    hosts = dict(load_inventory(args.inventory).hosts) if args.inventory else {}
    address = args.coordinator or os.environ.get(COORDINATOR_ENV) or next(
        (str(h.extra[COORDINATOR_VAR]) for h in hosts.values() if h.extra.get(COORDINATOR_VAR)), None)
    if not address:
        print(f"san-hil labgrid reap: no coordinator: give --coordinator HOST[:PORT], set {COORDINATOR_ENV}, or set "
              f"{COORDINATOR_VAR} in the inventory", file=sys.stderr)
        return 2
    try:
        session = CoordinatorSession(address, f"{os.uname().nodename}/pytest-san-reaper")
    except CoordinatorError as exc:
        print(f"san-hil labgrid reap: cannot reach the {exc}", file=sys.stderr)
        return 1
    try:
        done = reap(session, hosts, min_age=args.min_age, dry_run=args.dry_run)
    except CoordinatorError as exc:
        print(f"san-hil labgrid reap: {exc}", file=sys.stderr)
        return 1
    finally:
        session.close()
    for line in done.lines(args.dry_run):
        print(line)
    return 1 if done.unchecked else 0


def add_labgrid_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hil.scheduling.reaper import DEFAULT_MIN_AGE

    labgrid = commands.add_parser("labgrid", allow_abbrev=False,
                                  help="the labgrid places of --san-labgrid runs (docs/labgrid.md)")
    sub = labgrid.add_subparsers(dest="labgrid_command", metavar="COMMAND", required=True)
    reap = sub.add_parser("reap", allow_abbrev=False,
                          help="cancel and release the places of pytest-san runs whose hosts hold no agent lease "
                               "(their holder died); safe from cron")
    reap.add_argument("--coordinator", metavar="HOST[:PORT]", default=None,
                      help="the labgrid coordinator (default: $LG_COORDINATOR, else the inventory's "
                           "san_labgrid_coordinator)")
    reap.add_argument("--inventory", default=None,
                      help=INVENTORY_HELP + "; the hosts' settings (key, known hosts, engine) by resource group name")
    reap.add_argument("--min-age", metavar="SECONDS", type=float, default=DEFAULT_MIN_AGE,
                      help=f"leave places acquired less than SECONDS ago (their agents may be starting; default "
                           f"{DEFAULT_MIN_AGE:g})")
    reap.add_argument("--dry-run", action="store_true", help="say what would be released, release nothing")
    reap.set_defaults(run=_reap)
