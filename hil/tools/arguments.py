"""What ``san-hil`` accepts on its command line, beyond argparse's own rules.

An option that was renamed gets an error naming its new spelling rather than being taken silently.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = ["refuse_renamed"]


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
