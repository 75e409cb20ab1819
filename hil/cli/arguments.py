"""What ``san-hil`` accepts on its command line, beyond argparse's own rules.

Before ``--`` every argument must be san-hil's: an unknown option is refused (with the nearest known one,
exit status 2) before any command runs, so a typo never boots a lab or reaches pytest. What follows ``--``
is passed on (to pytest, or to a guest's shell). An option that was renamed gets an error naming its new
spelling rather than being taken silently.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["INVENTORY_HELP", "PASS_ON", "chosen_parser", "refuse_renamed", "refuse_unknown", "split_passed_on"]


PASS_ON = "--"

# The --inventory of prepare and nightly (hil.inventory.load_inventory reads either form).
INVENTORY_HELP = "lab inventory: an Ansible inventory file, YAML or INI, with group_vars/ and host_vars/ beside it"


def split_passed_on(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(san-hil's arguments, what follows the first ``--``). Split here, not by argparse, whose handling
    of ``--`` among unknown arguments differs between Python versions."""
    args = list(argv)
    if PASS_ON not in args:
        return args, []
    at = args.index(PASS_ON)
    return args[:at], args[at + 1:]


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command ``args`` names: ``san-hil lab run``'s for ``lab run ...``."""
    current = parser
    while True:
        sub = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, sub.dest, None) if sub is not None else None
        if sub is None or name not in sub.choices:
            return current
        current = sub.choices[name]


def _known_options(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings]


def refuse_unknown(parser: argparse.ArgumentParser, unknown: Sequence[str], passes_on: str | None) -> NoReturn:
    """Exit 2 naming ``unknown`` and, for each unknown option, the nearest option ``parser`` has.

    ``passes_on``: what the command passes the arguments after ``--`` to (pytest), if the error should say so.
    """
    known = _known_options(parser)
    hints = {}
    for word in unknown:
        option = word.partition("=")[0]
        if not option.startswith("-"):
            continue
        # Every parser has allow_abbrev=False (`--kernel` once silently meant `--kernel-cache`): an
        # abbreviation is refused, naming each option it could stand for in full.
        longer = [k for k in known if k.startswith(option) and option.startswith("--") and len(option) > 2]
        near = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
        if longer:
            hints[option] = f"abbreviations are not accepted: did you mean {' or '.join(longer)}?"
        elif near:
            hints[option] = f"did you mean {near[0]}?"
    message = f"unrecognized arguments: {' '.join(unknown)}"
    if len(hints) == 1:
        message += f" ({next(iter(hints.values()))})"
    elif hints:
        message += " (" + "; ".join(f"{option}: {hint}" for option, hint in hints.items()) + ")"
    if passes_on:
        message += f"; {passes_on}'s arguments go after {PASS_ON}: {parser.prog} [options] {PASS_ON} [{passes_on} args]"
    parser.error(message)


class _Renamed(argparse.Action):
    """An option that was renamed: using it is an error naming the new one (argparse's ``error``: exit 2)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, why: str, **kwargs: Any) -> None:
        kwargs.update(nargs="?", help=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new
        self.why = why

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        value = f" {values}" if isinstance(values, str) else ""
        parser.error(f"{option_string} is not an option of this command: use {self.new}{value} ({self.why})")


def refuse_renamed(parser: argparse.ArgumentParser, old: str, new: str, why: str) -> None:
    """Make ``old`` an error on ``parser`` that names ``new`` (and ``why``), hidden from ``--help``."""
    parser.add_argument(old, action=_Renamed, new=new, why=why, dest=f"renamed_{old.lstrip('-').replace('-', '_')}",
                        default=argparse.SUPPRESS)
