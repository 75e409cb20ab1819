"""The ``san-hil`` command (its subcommands arrive with host preparation and the lab)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="san-hil", description="pytest-san hardware-in-the-loop tools")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
