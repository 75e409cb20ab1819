"""The controller's stand-in for a process under observation on an agent (``hil/agent/rsockets``): it follows
``pytest_san.observed.ObservedProcess``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hil.controller.declared import declared, remote
from hil.controller.remote import Remote
from pytest_san.observed import Outcome

if TYPE_CHECKING:
    from pytest_san.observed import ObservedProcess

SPAWN_TIMEOUT = 120.0
"""Seconds a process under observation may take to start (``HilBackend.spawn_observed``)."""
SLACK = 60.0
"""Seconds the controller waits beyond a call's own deadline: the agent measures a hung process for a second,
reads the kernel twice and kills it before answering."""


@declared
class RemoteObserved(Remote):
    @property
    @remote
    def pid(self) -> int:
        return int(self._call("describe")["pid"])

    @remote
    def call(self, call: str, args: Mapping[str, object] | None = None, deadline: float = 30.0) -> Outcome:
        outcome: Outcome = self._call("call", call, dict(args or {}), deadline, timeout=deadline + SLACK)
        return outcome

    @remote
    def start(self, call: str, args: Mapping[str, object] | None = None) -> int:
        return int(self._call("start", call, dict(args or {})))

    @remote
    def finish(self, started: int, call: str, deadline: float = 30.0) -> Outcome:
        outcome: Outcome = self._call("finish", started, call, deadline, timeout=deadline + SLACK)
        return outcome

    @remote
    def kernel(self) -> Mapping[str, Any]:
        held: Mapping[str, Any] = self._call("kernel")
        return held

    @remote
    def exit(self, deadline: float = 30.0) -> Outcome:
        outcome: Outcome = self._call("exit", deadline, timeout=deadline + SLACK)
        return outcome

    @remote
    def kill(self) -> None:
        self._call("kill")


# mypy checks the stand-in against its protocol (no runtime cost).
if TYPE_CHECKING:
    def _is_observed(p: RemoteObserved) -> ObservedProcess: return p
