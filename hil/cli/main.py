"""The ``san-hil`` command: its entry point (``main``, the console script and ``python -m hil.cli``) and its parser
(``build_parser``), to which each command's module of :mod:`hil.cli` adds its own."""

from __future__ import annotations

import argparse
import sys

from hil.cli.arguments import INVENTORY_HELP, chosen_parser, refuse_renamed, refuse_unknown, split_passed_on
from hil.cli.console import log_to_stderr, safe_streams
from hil.controller.errors import AgentError
from hil.extras import missing_extra
from hil.inventory import InventoryError, load_inventory
from hil.transport.base import TransportError
from pytest_san import __version__

# --hosts is a count of guests in `lab up`/`lab run` (docs/lab.md); host names are --limit, as in Ansible.
LIMIT_HELP = "comma-separated names of the group's hosts to use (default: all of them)"
HOSTS_RENAMED = "host names are selected with --limit NAMES; --hosts N is the number of guests of `san-hil lab up`"
VERBOSE_HELP = "also show agents starting and stopping, SSH connections and leases (hil's DEBUG records)"


def _hosts_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inventory", required=True, help=INVENTORY_HELP)
    parser.add_argument("--group", default="san", help="inventory group (default: san)")
    parser.add_argument("--limit", default=None, metavar="NAMES", help=LIMIT_HELP)
    refuse_renamed(parser, "--hosts", "--limit", HOSTS_RENAMED)


def _prepare(args: argparse.Namespace) -> int:
    from hil.cli.prepare import prepare

    hosts = load_inventory(args.inventory).select(args.group, args.limit.split(",") if args.limit else None)
    status, text = prepare(hosts, create_rxe=args.create_rxe, as_json=args.json)
    print(text)
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="san-hil", description="pytest-san hardware-in-the-loop tools",
                                     allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"san-hil {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    prep = commands.add_parser("prepare", allow_abbrev=False,
                               help="check each lab host (RDMA device, port, GID, netdev, memlock, pyverbs) and "
                                    "say what is missing")
    _hosts_arguments(prep)
    prep.add_argument("--create-rxe", action="store_true",
                      help="add a Soft-RoCE device (san_device, default rxe0) on san_netdev where it is missing")
    prep.add_argument("--json", action="store_true", help="print the reports as JSON")
    prep.set_defaults(run=_prepare)
    from hil.cli.lab import add_lab_commands

    add_lab_commands(commands)
    from hil.cli.nightly import add_nightly_command

    add_nightly_command(commands)
    from hil.cli.mutants import add_mutants_command

    add_mutants_command(commands)
    from hil.cli.run import add_run_command

    add_run_command(commands)
    from hil.cli.matrix import add_matrix_command

    add_matrix_command(commands)
    from hil.cli.labgrid import add_labgrid_command

    add_labgrid_command(commands)
    refuse_renamed(commands.choices["nightly"], "--hosts", "--limit", HOSTS_RENAMED)
    _verbose_after_commands(parser)
    return parser


def _verbose_after_commands(parser: argparse.ArgumentParser) -> None:
    """``-v`` after a command too (``san-hil lab up -v``), not only before it. Its default is SUPPRESS: a
    command given no ``-v`` leaves the value of a ``-v`` before it alone. (What follows ``lab ssh GUEST``
    is the guest's command, ``-v`` included.)"""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                     help=VERBOSE_HELP)
                _verbose_after_commands(command)


def main(argv: list[str] | None = None) -> int:
    safe_streams()  # an ASCII locale must not crash a command on a host name or a path it prints
    # Everything before `--` is ours and checked before any command runs (a typo must not boot a lab);
    # what follows it is passed on, by the commands that pass arguments on (lab run, lab ssh, nightly).
    ours, passed_on = split_passed_on(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(ours)
    command = chosen_parser(parser, args)
    passes_on = getattr(args, "accepts_extra_args", False)
    if unknown:
        refuse_unknown(command, unknown, getattr(args, "passes_on", "pytest") if passes_on else None)
    if passed_on and not passes_on:
        command.error(f"takes no arguments after --: {' '.join(passed_on)}")
    args.extra_args = passed_on
    if args.command is None:
        parser.print_help()
        return 2
    try:
        with log_to_stderr(args.verbose):  # the lab's progress, and warnings, on stderr (library code only logs)
            status: int = args.run(args)
    except InventoryError as exc:
        print(f"san-hil: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        why = missing_extra(exc)
        if why is None:
            raise
        print(f"san-hil {args.command}: {why}", file=sys.stderr)
        return 2
    except (OSError, AgentError, TransportError) as exc:  # the world, not a bug: one line, never a traceback
        print(f"san-hil {args.command}: {one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"san-hil {args.command}: interrupted", file=sys.stderr)
        return 130
    return status


def one_line(exc: BaseException) -> str:
    """An expected failure on one line: an OSError's words and path (``Permission denied: /x``), else the
    first line of its message (an agent's or transport's, which names the host)."""
    if isinstance(exc, OSError) and exc.strerror:
        paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
        return f"{exc.strerror}: {' -> '.join(paths)}" if paths else exc.strerror
    return (str(exc).strip() or type(exc).__name__).splitlines()[0]
