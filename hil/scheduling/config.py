"""What a labgrid-scheduled run asks for, validated: the place filter, the coordinator, the priority; and who
asks (the session's name in labgrid, which names the controller, the run and the worker).

Standard library only: the plugin reads and checks these before labgrid is imported, so a bad option is one
line whether or not the extra is installed.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "COORDINATOR_ENV",
    "COORDINATOR_VAR",
    "IDENTITY_PREFIX",
    "Identity",
    "LabgridConfig",
    "LabgridConfigError",
    "identity_of",
    "parse_filter",
]

COORDINATOR_ENV = "LG_COORDINATOR"  # labgrid's own
COORDINATOR_VAR = "san_labgrid_coordinator"  # the inventory variable (a group's, usually san's or all's)
IDENTITY_PREFIX = "pytest-san."  # the user part of every session name pytest-san's runs use in labgrid
_TAG_KEY = re.compile(r"[a-z][a-z0-9_]+")  # labgrid's TAG_KEY
_TAG_VALUE = re.compile(r"[A-Za-z0-9_.:-]+")
_TOKEN = re.compile(r"[^A-Za-z0-9_.-]")


class LabgridConfigError(ValueError):
    """A labgrid setting that cannot work; the message names the option."""


def parse_filter(text: str) -> dict[str, str]:
    """``san=verbs-pair`` or ``san=verbs-pair,rack=2`` (commas or spaces): the tags a place must have
    (``name=PLACE`` picks one place by name, as in labgrid)."""
    tags: dict[str, str] = {}
    for pair in text.replace(",", " ").split():
        key, sep, value = pair.partition("=")
        if not sep or not _TAG_KEY.fullmatch(key) or not _TAG_VALUE.fullmatch(value):
            raise LabgridConfigError(
                f"--san-labgrid {text!r}: {pair!r} is no tag filter; expected KEY=VALUE[,KEY=VALUE...] with a "
                "lowercase key of two or more letters, digits or _ (labgrid's tags), e.g. san=verbs-pair")
        if key in tags and tags[key] != value:
            raise LabgridConfigError(f"--san-labgrid {text!r}: tag {key!r} given twice")
        tags[key] = value
    if not tags:
        raise LabgridConfigError(f"--san-labgrid {text!r}: expected KEY=VALUE[,KEY=VALUE...], e.g. san=verbs-pair")
    return tags


@dataclass(frozen=True)
class LabgridConfig:
    """A run's labgrid settings, checked: the coordinator's address, where it came from, the filter, priority."""

    coordinator: str
    source: str  # "--san-labgrid-coordinator", "LG_COORDINATOR" or "the inventory's san_labgrid_coordinator"
    tags: Mapping[str, str] = field(hash=False)
    priority: float = 0.0

    @property
    def filter_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.tags.items())

    @classmethod
    def from_settings(cls, filter_text: str, *, option: str | None, environ: Mapping[str, str],
                      inventory: str | None, priority: float | None) -> LabgridConfig:
        """The coordinator from ``--san-labgrid-coordinator``, else ``LG_COORDINATOR``, else the inventory."""
        tags = parse_filter(filter_text)
        given = [(value.strip(), source) for value, source in (
            (option, "--san-labgrid-coordinator"), (environ.get(COORDINATOR_ENV), COORDINATOR_ENV),
            (inventory, f"the inventory's {COORDINATOR_VAR}")) if value is not None and value.strip()]
        if not given:
            raise LabgridConfigError(
                f"--san-labgrid {filter_text!r}: no labgrid coordinator: give --san-labgrid-coordinator HOST[:PORT], "
                f"set {COORDINATOR_ENV}, or set {COORDINATOR_VAR} in the inventory")
        address, source = given[0]
        if any(c.isspace() for c in address) or "/" in address:
            raise LabgridConfigError(f"{source} {address!r}: expected HOST[:PORT]")
        if priority is not None and priority != priority:  # NaN
            raise LabgridConfigError("--san-labgrid-priority: expected a number")
        return cls(address, source, tags, float(priority or 0.0))


def _token(text: str, limit: int = 40) -> str:
    return _TOKEN.sub("_", text)[:limit] or "_"


@dataclass(frozen=True)
class Identity:
    """Who a session is in labgrid: ``CONTROLLER/pytest-san.USER.RUN.WORKER`` (labgrid's ``host/user``)."""

    controller: str
    user: str
    run: str
    worker: str

    @property
    def name(self) -> str:
        user = f"{IDENTITY_PREFIX}{_token(self.user)}.{_token(self.run)}.{_token(self.worker)}"
        return f"{_token(self.controller, 60)}/{user}"

    def describe(self) -> str:
        return f"worker {self.worker} of run {self.run} on {self.controller} (user {self.user})"


def identity_of(name: str) -> Identity | None:
    """The identity a session name stands for, if it is one of pytest-san's runs; else None."""
    controller, sep, user = name.partition("/")
    if not sep or not user.startswith(IDENTITY_PREFIX):
        return None
    parts = user[len(IDENTITY_PREFIX):].split(".")
    if len(parts) < 3:
        return None
    return Identity(controller, ".".join(parts[:-2]), parts[-2], parts[-1])


def current_identity(run: str, worker: str) -> Identity:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return Identity(socket.gethostname(), user, run, worker)
