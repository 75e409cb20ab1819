"""Conformance bookkeeping: which rules each SAN test checked and how it ended.

Kept free of pytest so it can be unit-tested on its own and merged across pytest-xdist workers
(each worker sends ``to_dict()``; the controller ``merge``s ``from_dict`` of every worker). ``load_report`` reads
a written one back (``pytest_san.mutants.runner``, ``san-hil matrix``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

RULE_IDS: tuple[str, ...] = tuple(f"R{i}" for i in range(1, 15)) + tuple(f"P{i}" for i in range(1, 6))
"""Every rule of the conformance catalog (CONTRACT.md section 3), in catalog order."""

LEAK_RULE = "R11"
PIN_LEAK = "pin"
"""The kind of a leak the kernel's books of pinned pages found (hil's pin witness): a page pinned that no
registration or proxy pin of the books needs, or one a live registration does not pin. It counts against R12
as well as R11."""


def leak_rules(leaks: Iterable[str]) -> list[str]:
    """The rules a test's leaks (``str(Leak)``: ``"node: kind detail"``) count against: R11, and R12 too when one
    is a pin leak."""
    kinds = {leak.partition(": ")[2].partition(" ")[0] for leak in leaks}
    return [LEAK_RULE, *(["R12"] if PIN_LEAK in kinds else [])] if kinds else []
"""A registration or allocation left after close is evidence against this rule."""

Outcome = Literal["passed", "failed", "skipped", "deviating"]
OUTCOMES: tuple[Outcome, ...] = ("passed", "failed", "skipped", "deviating")
"""``deviating``: failed as a declared deviation says it does (pytest_san.deviations)."""

# Combining phases: any failure wins, then a declared one, then a skip; passed only if nothing else happened.
_SEVERITY: dict[str, int] = {"passed": 0, "skipped": 1, "deviating": 2, "failed": 3}


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


@dataclasses.dataclass
class ModelResult:
    """What the reference model found (the report's ``"model"`` section, CONTRACT.md section 5): the suite's run
    (``pytest --pyargs pytest_san.scenarios``) and ``pytest --pyargs pytest_san.model``'s, merged.

    ``divergences`` are as ``pytest_san.model`` renders them (dicts with the shrunk steps and the ``rules`` each
    breaks); ``costs``
    holds each run's cost line; under pytest-xdist the controller merges every worker's runs.
    """

    backend: str
    sequences: int = 0
    steps: int = 0
    divergences: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    seeds: list[int] = dataclasses.field(default_factory=list)
    differential: bool = False
    seconds: float = 0.0
    costs: list[str] = dataclasses.field(default_factory=list)
    alternatives: dict[str, int] = dataclasses.field(default_factory=dict)  # documented alternative -> steps
    regressions: int = 0  # past divergences' sequences replayed

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "sequences": self.sequences, "steps": self.steps,
                "regressions": self.regressions,
                "divergences": list(self.divergences), "seeds": list(self.seeds), "differential": self.differential,
                "seconds": round(self.seconds, 3), "costs": list(self.costs),
                "alternatives": dict(sorted(self.alternatives.items()))}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelResult:
        return cls(str(data.get("backend", "")), int(data.get("sequences", 0)), int(data.get("steps", 0)),
                   list(data.get("divergences", ())), [int(s) for s in data.get("seeds", ())],
                   bool(data.get("differential", False)), float(data.get("seconds", 0.0)),
                   [str(c) for c in data.get("costs", ())],
                   {str(k): int(v) for k, v in dict(data.get("alternatives", {})).items()},
                   int(data.get("regressions", 0)))

    def merge(self, other: ModelResult) -> None:
        self.backend = self.backend or other.backend
        self.sequences += other.sequences
        self.steps += other.steps
        self.regressions += other.regressions
        self.divergences += other.divergences
        self.seeds += other.seeds
        self.differential = self.differential or other.differential
        self.seconds += other.seconds
        self.costs += other.costs
        for name, count in other.alternatives.items():
            self.alternatives[name] = self.alternatives.get(name, 0) + count

    def lines(self) -> list[tuple[str, bool]]:
        """The terminal summary's lines: (line, is a divergence)."""
        mode = " (differential, against a fresh emulator)" if self.differential else ""
        seeds = ", ".join(str(s) for s in self.seeds)
        out = [(f"model on {self.backend or '(none)'}{mode}: {self.sequences} sequences, {self.steps} steps, "
                f"{self.regressions} regressions, {len(self.divergences)} divergence(s); seed {seeds} "
                "(replay: --san-model-seed)", False)]
        out += [(f"  cost: {cost}", False) for cost in self.costs]
        if self.alternatives:
            met = ", ".join(f"{name} {count}" for name, count in sorted(self.alternatives.items()))
            out.append((f"  documented alternatives expected (steps): {met}", False))
        for div in self.divergences:
            breaks = f", breaking {', '.join(div['rules'])}" if div.get("rules") else ""
            out.append((f"  divergence ({div.get('kind')}, seed {div.get('seed')} sequence {div.get('sequence')}"
                        f"{breaks}): {div.get('side')}: {div.get('message')}", True))
            out += [(f"  {line}", True) for line in div.get("steps", ())]
        return out


class ConformanceReport:
    """Per-test outcomes with their rule ids; renders the JSON dict and the terminal table."""

    def __init__(self, backend: str = "", capabilities: Iterable[str] = ()) -> None:
        self.backend = backend
        self.capabilities: set[str] = set(capabilities)  # what every node has
        self.node_capabilities: dict[str, set[str]] = {}  # node name -> what it has
        self.tests: list[TestResult] = []
        self.model: ModelResult | None = None  # set once pytest_san.model ran
        self.deviations: list[dict[str, Any]] = []  # Deviation.to_dict of each declared one, with "observed"

    def record_model(self, result: ModelResult) -> None:
        """Add a model run's result (each run of the model test adds its own); ``result`` stays as it is."""
        if self.model is None:
            self.model = copy.deepcopy(result)  # later runs merge into the report's own
        else:
            self.model.merge(result)

    def record(self, nodeid: str, rules: Iterable[str], outcome: Outcome, reason: str = "", *,
               leaked: bool = False, leak_ids: Iterable[str] = ()) -> TestResult:
        """Record a finished test. A leak fails the test and counts against R11 as well (and against
        ``leak_ids``, the rules ``leak_rules`` names for its leaks)."""
        ids = list(rules)
        unknown = [rule for rule in ids if not is_rule_id(rule)]
        if unknown:
            raise ValueError(f"{nodeid}: unknown rule id(s) {', '.join(map(repr, unknown))}")
        if leaked:
            outcome = "failed"
            ids += list(leak_ids) or [LEAK_RULE]
        result = TestResult(nodeid, catalog_order(ids), outcome, reason)
        self.tests.append(result)
        return result

    def counts(self) -> dict[str, dict[str, int]]:
        """{rule: {"passed": n, "failed": n, "skipped": n, "deviating": n}} for every rule of the catalog."""
        table: dict[str, dict[str, int]] = {rule: dict.fromkeys(OUTCOMES, 0) for rule in RULE_IDS}
        for test in self.tests:
            for rule in test.rules:
                table[rule][test.outcome] += 1
        return table

    def to_dict(self) -> dict[str, Any]:
        data = {
            "backend": self.backend,
            "capabilities": sorted(self.capabilities),
            "node_capabilities": {name: sorted(caps) for name, caps in sorted(self.node_capabilities.items())},
            "rules": self.counts(),
            "tests": [test.to_dict() for test in self.tests],
            "deviations": [dict(entry) for entry in self.deviations],
        }
        if self.model is not None:
            data["model"] = self.model.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConformanceReport:
        report = cls(str(data.get("backend", "")), data.get("capabilities", ()))
        report.node_capabilities = {str(name): set(caps) for name, caps in data.get("node_capabilities", {}).items()}
        report.tests = [TestResult.from_dict(test) for test in data.get("tests", ())]
        if data.get("model") is not None:
            report.model = ModelResult.from_dict(data["model"])
        report.deviations = [dict(entry) for entry in data.get("deviations", ())]
        return report

    def merge(self, other: ConformanceReport) -> None:
        """Add another report's tests (another xdist worker's) to this one."""
        if other.backend and self.backend and other.backend != self.backend:
            raise ValueError(f"cannot merge a report of backend {other.backend!r} "
                             f"into one of backend {self.backend!r}")
        self.backend = self.backend or other.backend
        self.capabilities |= other.capabilities
        for name, caps in other.node_capabilities.items():
            self.node_capabilities.setdefault(name, set()).update(caps)
        if self.node_capabilities:  # what every node has, whichever worker used it
            self.capabilities = set.intersection(*self.node_capabilities.values())
        self.tests.extend(other.tests)
        if other.model is not None:
            self.record_model(other.model)
        self.merge_deviations(other.deviations)

    def merge_deviations(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Deviations and known differences from another worker: one entry each, observed when any worker
        observed it, applied on every host any worker named."""
        def key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
            return entry.get("kind", "declared"), entry["rule"], entry["implementation"], entry["what"]
        mine = {key(entry): entry for entry in self.deviations}
        for entry in entries:
            if key(entry) in mine:
                known = mine[key(entry)]
                known["observed"] = bool(known["observed"] or entry["observed"])
                if "hosts" in entry:
                    known["hosts"] = sorted({*known.get("hosts", ()), *entry["hosts"]})
            else:
                self.deviations.append(mine.setdefault(key(entry), dict(entry)))

    def table_lines(self) -> list[tuple[str, bool]]:
        """The terminal table: (line, has failures) pairs; rules no test exercised are left out."""
        counts = self.counts()
        exercised = [rule for rule in RULE_IDS if any(counts[rule].values())]
        lines = [(f"{'rule':<5} {'passed':>7} {'failed':>7} {'skipped':>8} {'deviating':>10}", False)]
        for rule in exercised:
            row = counts[rule]
            lines.append((f"{rule:<5} {row['passed']:>7} {row['failed']:>7} {row['skipped']:>8} {row['deviating']:>10}",
                          row["failed"] > 0))
        idle = len(RULE_IDS) - len(exercised)
        if idle:
            lines.append((f"({idle} of {len(RULE_IDS)} rules not exercised)", False))
        return lines + self.deviation_lines()

    def deviation_lines(self) -> list[tuple[str, bool]]:
        """Each declared deviation, observed or not (one not observed is shown as a failure), then each known
        difference by name (docs/deviations.md has its text), never shown as a failure."""
        lines = []
        for entry in self.deviations:
            kind = entry.get("kind", "declared")
            head = f"{entry['rule']} ({entry['why']})"
            if kind == "workaround":
                hosts = ", ".join(entry.get("hosts", ())) or "(no host)"
                lines.append((f"workaround {head} {entry.get('name')} by {entry['implementation']} on {hosts}"
                              " [applied]", False))
            elif kind == "alternative":
                seen = "met by the model" if entry["observed"] else "in effect, not met by the model"
                lines.append((f"alternative {head} {entry.get('name')} for {entry['implementation']} [{seen}]",
                              False))
            else:
                seen = "observed" if entry["observed"] else "declared but NOT observed"
                lines.append((f"deviation {head} by {entry['implementation']}: {entry['what']} [{seen}]",
                              not entry["observed"]))
        return lines

    def header_line(self) -> str:
        caps = ", ".join(sorted(self.capabilities)) or "(none)"
        line = f"backend: {self.backend or '(none)'}  capabilities: {caps}"
        # Nodes that differ from what they all have are named with their own extras.
        extras = [f"{name} +{','.join(sorted(own - self.capabilities))}"
                  for name, own in sorted(self.node_capabilities.items()) if own - self.capabilities]
        return line + (f"  (and {'; '.join(extras)})" if extras else "")


def load_report(path: Path) -> dict[str, Any]:
    """A report file read back (``--san-report``'s JSON, or the report.json of a run of them): the JSON object in
    ``path``; empty when the file is missing, unreadable, not JSON or not an object (a run that died before
    writing its report)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
