"""What a mutmut run left in its work directory, per mutant: its status, whether it changes only a message,
its triage key; and the numbers per file."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .messages import MUTMUT_ORIG, MessageRules, is_message_only, mutant_functions, plain_name
from .triage import Entry, change_summary, function_text, mutant_key

# mutmut's exit codes (mutmut/stats.py), reduced to what the gate needs: killed, survived (a mutant no test
# reaches survives too), or not run.
KILLED = "killed"
SURVIVED = "survived"
NOT_RUN = "not run"
_STATUS = {1: KILLED, 3: KILLED, 0: SURVIVED, 2: NOT_RUN, 5: SURVIVED, 33: SURVIVED, 34: NOT_RUN, 35: SURVIVED,
           36: KILLED, -24: KILLED, 24: KILLED, 152: KILLED, 255: KILLED, 37: KILLED, -11: KILLED, -9: KILLED}


def status_of(exit_code: int | None) -> str:
    """killed (tests failed, timed out, crashed), survived (tests passed, or no test reached it), or not run."""
    if exit_code is None:
        return NOT_RUN
    return _STATUS.get(exit_code, SURVIVED)


@dataclass(frozen=True)
class Mutant:
    name: str  # mutmut's: pytest_san.spi.emulator.proxy.xǁEmulatedProxyǁallocate_pages__mutmut_3
    path: str  # pytest_san/spi/emulator/proxy.py
    function: str  # EmulatedProxy.allocate_pages
    status: str
    message_only: bool
    key: str
    change: str

    @property
    def triage_key(self) -> tuple[str, str, str]:
        return (self.path, self.function, self.key)


def read_file(mutated: Path, relative: str, exit_codes: Mapping[str, int | None],
              rules: MessageRules) -> list[Mutant]:
    """The mutants of one mutated file (``relative``: its path in the project) and their exit codes."""
    module = relative[:-3].replace("/", ".")
    out = []
    for local, (original, mutant) in mutant_functions(mutated.read_text(encoding="utf-8")).items():
        name = f"{module}.{local}"
        if name not in exit_codes:
            continue
        mangled = original.name[: -len(MUTMUT_ORIG)]
        function = plain_name(mangled)
        before, after = function_text(original, "f"), function_text(mutant, "f")
        out.append(Mutant(name, relative, function, status_of(exit_codes[name]),
                          is_message_only(original, mutant, rules, function.rpartition(".")[2]),
                          mutant_key(before, after), change_summary(before, after)))
    return out


def read_run(mutants_dir: Path, rules: MessageRules) -> list[Mutant]:
    """Every mutant of a run: mutmut writes ``X.py.meta`` (exit codes) beside each mutated ``X.py``."""
    out: list[Mutant] = []
    for meta in sorted(mutants_dir.rglob("*.py.meta")):
        codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        if not codes:
            continue
        mutated = meta.with_suffix("")
        out += read_file(mutated, mutated.relative_to(mutants_dir).as_posix(), codes, rules)
    return out


@dataclass
class FileCounts:
    mutants: int = 0
    message_only: int = 0
    killed: int = 0
    survived: int = 0  # non-message survivors, the equivalent ones included
    equivalent: int = 0
    open: int = 0  # known survivors a scenario could kill (survivors.md says what it would take)
    closed_survivors: int = 0  # triaged closed, yet alive: a scenario lost its grip
    untriaged: int = 0
    not_run: int = 0

    @property
    def counted(self) -> int:
        """The mutants that change more than a message (and ran)."""
        return self.killed + self.survived


@dataclass
class Verdict:
    by_file: dict[str, FileCounts] = field(default_factory=dict)
    untriaged: list[Mutant] = field(default_factory=list)
    reopened: list[tuple[Mutant, Entry]] = field(default_factory=list)  # closed in survivors.md, alive again
    stale: list[Entry] = field(default_factory=list)  # equivalent entries no survivor matches (any more)

    def total(self) -> FileCounts:
        total = FileCounts()
        for counts in self.by_file.values():
            for name in vars(total):
                setattr(total, name, getattr(total, name) + getattr(counts, name))
        return total

    @property
    def failed(self) -> bool:
        return bool(self.untriaged or self.reopened)


def judge(mutants: Iterable[Mutant], triage: Mapping[tuple[str, str, str], Entry]) -> Verdict:
    """Count every file's mutants, and hold every surviving non-message mutant to its triage entry."""
    verdict = Verdict()
    alive: set[tuple[str, str, str]] = set()
    seen_paths: set[str] = set()
    for m in mutants:
        counts = verdict.by_file.setdefault(m.path, FileCounts())
        seen_paths.add(m.path)
        counts.mutants += 1
        if m.status == NOT_RUN:
            counts.not_run += 1
        elif m.message_only:
            counts.message_only += 1
        elif m.status == KILLED:
            counts.killed += 1
        else:
            counts.survived += 1
            alive.add(m.triage_key)
            entry = triage.get(m.triage_key)
            if entry is not None and entry.status == "equivalent":
                counts.equivalent += 1
            elif entry is not None and entry.status == "open":
                counts.open += 1
            elif entry is not None and entry.status == "closed":
                counts.closed_survivors += 1
                verdict.reopened.append((m, entry))
            else:
                counts.untriaged += 1
                verdict.untriaged.append(m)
    verdict.stale = [e for k, e in triage.items()
                     if e.status in ("equivalent", "open") and e.path in seen_paths and k not in alive]
    return verdict


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def table(verdict: Verdict) -> list[str]:
    """The numbers per file, as a markdown table."""
    lines = ["| file | mutants | not run | message-only | counted | killed | survived | equivalent | open "
             "| untriaged |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows = sorted(verdict.by_file.items())
    for path, c in [*rows, ("all", verdict.total())]:
        bad = c.untriaged + c.closed_survivors
        name = path if path == "all" else f"`{path}`"
        lines.append(f"| {name} | {c.mutants} | {c.not_run} | {c.message_only} | {c.counted} |"
                     f" {c.killed} | {c.survived} ({percent(c.survived, c.counted)}) | {c.equivalent} | "
                     f"{c.open} | {bad} ({percent(bad, c.counted)}) |")
    return lines
