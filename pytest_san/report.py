"""Conformance bookkeeping: which rules each SAN test checked and how it ended.

Kept free of pytest so it can be unit-tested on its own and merged across pytest-xdist workers
(each worker sends ``to_dict()``; the controller ``merge``s ``from_dict`` of every worker).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Literal

RULE_IDS: tuple[str, ...] = tuple(f"R{i}" for i in range(1, 15)) + tuple(f"P{i}" for i in range(1, 6))
"""Every rule of the conformance catalog (CONTRACT.md section 3), in catalog order."""

LEAK_RULE = "R11"
"""A registration or allocation left after close is evidence against this rule."""

Outcome = Literal["passed", "failed", "skipped"]
OUTCOMES: tuple[Outcome, ...] = ("passed", "failed", "skipped")

# Combining phases: any failure wins, then a skip; a test passed only if nothing else happened.
_SEVERITY: dict[str, int] = {"passed": 0, "skipped": 1, "failed": 2}


def is_rule_id(value: object) -> bool:
    return isinstance(value, str) and value in RULE_IDS


def catalog_order(rules: Iterable[str]) -> tuple[str, ...]:
    """Known rule ids, deduplicated, in catalog order."""
    wanted = set(rules)
    return tuple(rule for rule in RULE_IDS if rule in wanted)


def worse(a: Outcome, b: Outcome) -> Outcome:
    """The outcome a test has when one phase ended ``a`` and another ``b``."""
    return a if _SEVERITY[a] >= _SEVERITY[b] else b


@dataclasses.dataclass(frozen=True)
class TestResult:
    """One SAN test as the report keeps it; ``rules`` already include R11 when it leaked."""

    __test__ = False  # not a pytest test class, despite the name

    nodeid: str
    rules: tuple[str, ...]
    outcome: Outcome
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"nodeid": self.nodeid, "rules": list(self.rules), "outcome": self.outcome,
                "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TestResult:
        outcome = data["outcome"]
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r} for {data['nodeid']!r}")
        return cls(nodeid=str(data["nodeid"]), rules=catalog_order(data["rules"]), outcome=outcome,
                   reason=str(data.get("reason", "")))


class ConformanceReport:
    """Per-test outcomes with their rule ids; renders the JSON dict and the terminal table."""

    def __init__(self, backend: str = "", capabilities: Iterable[str] = ()) -> None:
        self.backend = backend
        self.capabilities: set[str] = set(capabilities)
        self.tests: list[TestResult] = []

    def record(self, nodeid: str, rules: Iterable[str], outcome: Outcome, reason: str = "", *,
               leaked: bool = False) -> TestResult:
        """Record a finished test. A leak fails the test and counts against R11 as well."""
        ids = list(rules)
        unknown = [rule for rule in ids if not is_rule_id(rule)]
        if unknown:
            raise ValueError(f"{nodeid}: unknown rule id(s) {', '.join(map(repr, unknown))}")
        if leaked:
            outcome = "failed"
            ids.append(LEAK_RULE)
        result = TestResult(nodeid, catalog_order(ids), outcome, reason)
        self.tests.append(result)
        return result

    def counts(self) -> dict[str, dict[str, int]]:
        """{rule: {"passed": n, "failed": n, "skipped": n}} for every rule of the catalog."""
        table: dict[str, dict[str, int]] = {rule: dict.fromkeys(OUTCOMES, 0) for rule in RULE_IDS}
        for test in self.tests:
            for rule in test.rules:
                table[rule][test.outcome] += 1
        return table

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "capabilities": sorted(self.capabilities),
            "rules": self.counts(),
            "tests": [test.to_dict() for test in self.tests],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConformanceReport:
        report = cls(str(data.get("backend", "")), data.get("capabilities", ()))
        report.tests = [TestResult.from_dict(test) for test in data.get("tests", ())]
        return report

    def merge(self, other: ConformanceReport) -> None:
        """Add another report's tests (another xdist worker's) to this one."""
        if other.backend and self.backend and other.backend != self.backend:
            raise ValueError(f"cannot merge a report of backend {other.backend!r} "
                             f"into one of backend {self.backend!r}")
        self.backend = self.backend or other.backend
        self.capabilities |= other.capabilities
        self.tests.extend(other.tests)

    def table_lines(self) -> list[tuple[str, bool]]:
        """The terminal table: (line, has failures) pairs; rules no test exercised are left out."""
        counts = self.counts()
        exercised = [rule for rule in RULE_IDS if any(counts[rule].values())]
        lines = [(f"{'rule':<5} {'passed':>7} {'failed':>7} {'skipped':>8}", False)]
        for rule in exercised:
            row = counts[rule]
            lines.append((f"{rule:<5} {row['passed']:>7} {row['failed']:>7} {row['skipped']:>8}",
                          row["failed"] > 0))
        idle = len(RULE_IDS) - len(exercised)
        if idle:
            lines.append((f"({idle} of {len(RULE_IDS)} rules not exercised)", False))
        return lines

    def header_line(self) -> str:
        caps = ", ".join(sorted(self.capabilities)) or "(none)"
        return f"backend: {self.backend or '(none)'}  capabilities: {caps}"
