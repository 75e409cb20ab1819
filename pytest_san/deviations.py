"""Declared deviations: a rule an implementation under test breaks on purpose, and why (docs/deviations.md).

Google's rdma-unit-test keeps a table of known deviations per device, each with its reason; this is
pytest-san's. A provider, proxy, switch or backend declares a ``Deviation`` (through the
``pytest_san_deviations`` hook, or a ``deviations()`` method: ``DeclaresDeviations``); a test of the rule
that the deviation names then fails *as declared*: the verdict counts it ``deviating``, apart from
failures. A declared deviation that such a test no longer shows is reported, as a strict xfail that passed.

Beside them the verdict lists the other known differences, which never decide a test's outcome (the same
type, made by ``Deviation.known``): a kernel workaround the verbs engine applies on one of the run's hosts, and
a documented alternative of the reference model (pytest_san/model/alternatives.py) in effect for the backend it
judged. Each entry of the report's ``"deviations"`` says which it is (``"kind"``).

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
    are the tests it explains (fnmatch patterns over a test's id or its name without the parameters).

    That is a declared deviation (``kind`` "declared"). The same type holds the known differences the verdict
    lists beside them, which explain no test (``tests`` empty; made by ``Deviation.known``): a kernel workaround
    ("workaround": ``what`` the kernel does without it, ``instead`` what the engine does, ``hosts`` where it is
    applied) or a documented alternative of the model ("alternative": ``what`` is the case, ``instead`` what is
    accepted there besides the emulator's answer, ``because`` why)."""

    rule: str
    implementation: str
    what: str
    why: Why
    tests: tuple[str, ...]
    reproducer: str | None = None  # a command that shows it (a kernel bug has one)
    kind: Kind = "declared"
    name: str | None = None  # a known difference's: the workaround's (quirks.py) or the alternative's id
    instead: str | None = None
    because: str | None = None
    hosts: tuple[str, ...] = ()

    @classmethod
    def known(cls, kind: Literal["workaround", "alternative"], name: str, rule: str, implementation: str,
              what: str, instead: str, why: Why, reproducer: str | None = None, because: str | None = None,
              hosts: Iterable[str] = ()) -> Deviation:
        """A known difference: listed in the verdict, deciding no test's outcome."""
        return cls(rule, implementation, what, why, (), reproducer, kind, name, instead, because, tuple(hosts))

    def __post_init__(self) -> None:
        declared = self.kind == "declared"
        label = f"deviation {self.what!r}" if declared else f"{self.kind} {self.name!r}"
        if self.kind not in KINDS:
            raise ValueError(f"{label}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not is_rule_id(self.rule):
            raise ValueError(f"{label}: rule {self.rule!r} is not a rule id (R1..R14, P1..P5)")
        for name in ("implementation", "what") if declared else ("name", "implementation", "what", "instead"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ValueError(f"{label} of {self.rule}: {name} must be a non-empty text, "
                                 f"not {getattr(self, name)!r}")
        if self.why not in WHYS:
            raise ValueError(f"{label} of {self.rule}: why {self.why!r} is not one of {', '.join(WHYS)}")
        tests: object = self.tests
        if not declared and tests != ():
            raise ValueError(f"{label}: a known difference explains no test, so names none, not {tests!r}")
        if declared and (not isinstance(tests, tuple) or not tests
                         or not all(isinstance(t, str) and t for t in tests)):
            raise ValueError(f"{label} of {self.rule}: tests must name the tests it explains (a tuple of "
                             f"patterns), not {self.tests!r}")
        if self.why == "kernel-bug" and not self.reproducer:
            raise ValueError(f"{label} of {self.rule}: a kernel bug needs its reproducer")

    def explains(self, nodeid: str, rules: Iterable[str]) -> bool:
        """Whether a test of ``rules`` with this id is one this deviation is declared for."""
        if self.rule not in rules:
            return False
        name = nodeid.rpartition("::")[2]
        bare = name.partition("[")[0]
        return any(fnmatch.fnmatchcase(text, pattern) for pattern in self.tests for text in (nodeid, name, bare))

    def to_dict(self, observed: bool) -> dict[str, Any]:
        """As the report's ``"deviations"`` holds it: every field (JSON's lists for the tuples), and
        ``observed``."""
        return {**dataclasses.asdict(self), "tests": list(self.tests), "hosts": list(self.hosts),
                "observed": observed}


@runtime_checkable
class ReportsDifferences(Protocol):
    """A backend that knows differences of its own to list in the verdict (the hil backend: the kernel
    workarounds its hosts' engines apply). Each is in effect, so observed, on this run."""

    def known_differences(self) -> Iterable[Deviation]: ...


@runtime_checkable
class DeclaresDeviations(Protocol):
    """A backend, provider, proxy or switch that declares its deviations itself."""

    def deviations(self) -> Iterable[Deviation]: ...


def differences_of(*objects: object) -> list[Deviation]:
    """What each object that ``ReportsDifferences`` lists, checked as ``deviations_of`` checks (each a known
    difference: a ``Deviation.known``)."""
    found: list[Deviation] = []
    for obj in objects:
        if isinstance(obj, ReportsDifferences):
            for entry in obj.known_differences():
                if not isinstance(entry, Deviation) or entry.kind == "declared":
                    raise TypeError(f"{type(obj).__name__}.known_differences() gave {entry!r}, "
                                    "not a known difference (pytest_san.Deviation.known)")
                found.append(entry)
    return found


def deviations_of(*objects: object) -> list[Deviation]:
    """What each object that ``DeclaresDeviations`` declares, checked: a non-Deviation is a TypeError naming
    who declared it."""
    found: list[Deviation] = []
    for obj in objects:
        if isinstance(obj, DeclaresDeviations):
            for entry in obj.deviations():
                if not isinstance(entry, Deviation) or entry.kind != "declared":
                    raise TypeError(f"{type(obj).__name__}.deviations() gave {entry!r}, not a declared "
                                    "pytest_san.Deviation")
                found.append(entry)
    return found
