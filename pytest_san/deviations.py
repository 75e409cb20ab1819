"""Declared deviations: a rule an implementation under test breaks on purpose, and why (SPEC 5.1).

Google's rdma-unit-test keeps a table of known deviations per device, each with its reason; this is
pytest-san's. A provider, proxy, switch or backend declares a ``Deviation`` (through the
``pytest_san_deviations`` hook, or a ``deviations()`` method: ``DeclaresDeviations``); a test of the rule
that the deviation names then fails *as declared*: the verdict counts it ``deviating``, apart from
failures. A declared deviation that such a test no longer shows is reported, as a strict xfail that passed.

Beside them the verdict lists the other known differences, which never decide a test's outcome
(``KnownDifference``): a kernel workaround the verbs engine applies on one of the run's hosts, and a documented
alternative of the reference model (pytest_san/model/alternatives.py) in effect for the backend it judged.
Each entry of the report's ``"deviations"`` says which it is (``"kind"``).

Kept free of pytest, like ``report.py``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable
from typing import Any, Literal, Protocol, runtime_checkable

from .report import is_rule_id

Why = Literal["by-design", "kernel-bug", "spec-ambiguity"]
WHYS: tuple[Why, ...] = ("by-design", "kernel-bug", "spec-ambiguity")
Kind = Literal["declared", "workaround", "alternative"]
KINDS: tuple[Kind, ...] = ("declared", "workaround", "alternative")


@dataclasses.dataclass(frozen=True)
class Deviation:
    """``rule`` is broken by ``implementation`` in the way ``what`` says, for the reason ``why``; ``tests``
    are the tests it explains (fnmatch patterns over a test's id or its name without the parameters)."""

    rule: str
    implementation: str
    what: str
    why: Why
    tests: tuple[str, ...]
    reproducer: str | None = None  # a command that shows it (a kernel bug has one)

    def __post_init__(self) -> None:
        if not is_rule_id(self.rule):
            raise ValueError(f"deviation {self.what!r}: rule {self.rule!r} is not a rule id (R1..R14, P1..P5)")
        for name in ("implementation", "what"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ValueError(f"deviation of {self.rule}: {name} must be a non-empty text, "
                                 f"not {getattr(self, name)!r}")
        if self.why not in WHYS:
            raise ValueError(f"deviation of {self.rule} ({self.what}): why {self.why!r} is not one of "
                             f"{', '.join(WHYS)}")
        tests: object = self.tests
        if not isinstance(tests, tuple) or not tests or not all(isinstance(t, str) and t for t in tests):
            raise ValueError(f"deviation of {self.rule} ({self.what}): tests must name the tests it explains "
                             f"(a tuple of patterns), not {self.tests!r}")
        if self.why == "kernel-bug" and not self.reproducer:
            raise ValueError(f"deviation of {self.rule} ({self.what}): a kernel bug needs its reproducer")

    def explains(self, nodeid: str, rules: Iterable[str]) -> bool:
        """Whether a test of ``rules`` with this id is one this deviation is declared for."""
        if self.rule not in rules:
            return False
        name = nodeid.rpartition("::")[2]
        bare = name.partition("[")[0]
        return any(fnmatch.fnmatchcase(text, pattern) for pattern in self.tests for text in (nodeid, name, bare))

    def to_dict(self, observed: bool) -> dict[str, Any]:
        return {"kind": "declared", "rule": self.rule, "implementation": self.implementation, "what": self.what,
                "why": self.why, "reproducer": self.reproducer, "tests": list(self.tests), "observed": observed}


@dataclasses.dataclass(frozen=True)
class KnownDifference:
    """A difference the verdict lists beside the declared deviations, never turning a test's outcome: a kernel
    workaround (``kind`` "workaround": ``what`` the kernel does without it, ``instead`` what the engine does,
    ``hosts`` where it is applied) or a documented alternative of the model ("alternative": ``what`` is the
    case, ``instead`` what is accepted there besides the emulator's answer, ``because`` why)."""

    kind: Literal["workaround", "alternative"]
    name: str  # the workaround's name (quirks.py) or the alternative's id (alternatives.py)
    rule: str  # the rule the difference bears on (the one its absence would break, or that allows it)
    implementation: str
    what: str
    instead: str
    why: Why
    reproducer: str | None = None
    because: str | None = None
    hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("workaround", "alternative"):
            raise ValueError(f"known difference {self.name!r}: kind {self.kind!r} is not workaround or alternative")
        if not is_rule_id(self.rule):
            raise ValueError(f"known difference {self.name!r}: rule {self.rule!r} is not a rule id (R1..R14, P1..P5)")
        if self.why not in WHYS:
            raise ValueError(f"known difference {self.name!r}: why {self.why!r} is not one of {', '.join(WHYS)}")

    def to_dict(self, observed: bool) -> dict[str, Any]:
        """As the report's ``"deviations"`` holds it: SPEC 5.1's fields (``tests`` empty: it explains no test's
        failure), then its own."""
        return {"kind": self.kind, "rule": self.rule, "implementation": self.implementation, "what": self.what,
                "why": self.why, "reproducer": self.reproducer, "tests": [], "observed": observed,
                "name": self.name, "instead": self.instead, "because": self.because, "hosts": list(self.hosts)}


@runtime_checkable
class ReportsDifferences(Protocol):
    """A backend that knows differences of its own to list in the verdict (the hil backend: the kernel
    workarounds its hosts' engines apply). Each is in effect, so observed, on this run."""

    def known_differences(self) -> Iterable[KnownDifference]: ...


@runtime_checkable
class DeclaresDeviations(Protocol):
    """A backend, provider, proxy or switch that declares its deviations itself."""

    def deviations(self) -> Iterable[Deviation]: ...


def differences_of(*objects: object) -> list[KnownDifference]:
    """What each object that ``ReportsDifferences`` lists, checked as ``deviations_of`` checks."""
    found: list[KnownDifference] = []
    for obj in objects:
        if isinstance(obj, ReportsDifferences):
            for entry in obj.known_differences():
                if not isinstance(entry, KnownDifference):
                    raise TypeError(f"{type(obj).__name__}.known_differences() gave {entry!r}, "
                                    "not a pytest_san.deviations.KnownDifference")
                found.append(entry)
    return found


def deviations_of(*objects: object) -> list[Deviation]:
    """What each object that ``DeclaresDeviations`` declares, checked: a non-Deviation is a TypeError naming
    who declared it."""
    found: list[Deviation] = []
    for obj in objects:
        if isinstance(obj, DeclaresDeviations):
            for entry in obj.deviations():
                if not isinstance(entry, Deviation):
                    raise TypeError(f"{type(obj).__name__}.deviations() gave {entry!r}, not a pytest_san.Deviation")
                found.append(entry)
    return found
