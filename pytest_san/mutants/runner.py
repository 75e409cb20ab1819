"""The runner of ``san-hil mutants`` (its command line is ``hil.cli.mutants``): the conformance suite against
every entry of the mutation corpus (``pytest_san.mutants``), or against an author's own (``--plugin``), on the
emulator or on an inventory's hosts, and the kill matrix of what it caught.

``--plugin MODULE`` (repeatable; a module name, a .py file or a directory of modules) runs the author's
planted bugs and legal variants *instead of* the shipped corpus; ``--corpus`` adds the shipped corpus to them.
Each is checked before anything runs (``pytest_san.mutants.plugins``) and its directory goes on the runs'
``PYTHONPATH``.

First the suite runs on the providers as they are (the baseline: what it fails there proves nothing about an
entry), then once per entry with the entry's plugin loaded (``-p``), each a pytest subprocess writing its
``--san-report``. An entry's ``failed`` rules are those it fails that the baseline passed. Verdicts (docs/providers.md):

* ``caught``: it failed a rule it breaks; ``caught_under`` says whether under ``all`` of them or ``some``, and
  ``missed`` names the rules it breaks that the verdict did not fail (a rule no scenario ran here aside): the
  verdict tells a user the whole story only when nothing is missed;
* ``other-rule``: it failed only rules it does not claim to break;
* ``survived``: it failed nothing (or its run could not report: ``error`` says why);
* ``not-applicable``: this backend cannot show the bug -- every scenario of the rules it breaks was skipped
  here, or the nodes lack a capability the bug needs (its ``NEEDS``).

A legal variant must fail nothing. The exit status is 1 when an applicable bug is not caught under a rule it
breaks, a legal variant fails a rule, or the baseline fails one; ``--model`` also runs ``pytest_san.model``
against each entry (a legal variant must get no divergence; what the model finds of the bugs is reported).
Writes ``OUT/mutants.json``, ``OUT/<entry>.json`` and ``OUT/<entry>.log``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_san.mutants import Entry, corpus, select
from pytest_san.mutants.plugins import plugin_entries
from pytest_san.report import RULE_IDS, load_report

__all__ = ["BASELINE", "CAUGHT", "NOT_APPLICABLE", "OTHER", "SURVIVED", "Run", "entries_in_play", "execute",
           "failed_rules", "failures", "matrix", "model_line", "pytest_argv", "run_corpus", "skipped_rules", "verdict"]

BASELINE = "baseline"
CAUGHT, OTHER, SURVIVED, NOT_APPLICABLE = "caught", "other-rule", "survived", "not-applicable"


@dataclass
class Run:
    """One pytest subprocess: the suite (or the model) with one entry's plugin, or none for the baseline."""

    name: str
    plugin: str | None
    report: Path
    log: Path
    exit_status: int | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> str | None:
        """Why the run says nothing about the entry, or None (pytest's 0 and 1 are answers)."""
        if self.exit_status not in (0, 1):
            return f"pytest exit {self.exit_status} (see {self.log})"
        if "rules" not in self.data:
            return f"no conformance report written (see {self.log})"
        return None


def pytest_argv(run: Run, target: str, backend: Sequence[str], extra: Sequence[str]) -> list[str]:
    plugin = ["-p", run.plugin] if run.plugin else []
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", target, *plugin,
            *backend, f"--san-report={run.report}", *extra]


def execute(run: Run, argv: Sequence[str], timeout: float, path: Sequence[str] = ()) -> Run:
    """Run ``argv``; ``path``: directories put first on its ``PYTHONPATH`` (where an author's plugins are)."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    if path:
        env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [os.environ.get("PYTHONPATH")])])
    with run.log.open("wb") as log:
        try:
            run.exit_status = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env, timeout=timeout, check=False).returncode
        except subprocess.TimeoutExpired:  # subprocess.run killed it
            run.exit_status = -9
    run.data = load_report(run.report)
    return run


def failed_rules(data: Mapping[str, Any]) -> set[str]:
    return {rule for rule, count in data.get("rules", {}).items() if count.get("failed")}


def skipped_rules(data: Mapping[str, Any]) -> set[str]:
    """Rules whose every scenario was skipped (for a missing capability: ``san_requires``)."""
    return {rule for rule, count in data.get("rules", {}).items()
            if count.get("skipped") and not count.get("passed") and not count.get("failed")}


def verdict(entry: Entry, run: Run, baseline: set[str]) -> dict[str, Any]:
    """The entry's line of ``mutants.json``."""
    failed = sorted(failed_rules(run.data) - baseline, key=RULE_IDS.index)
    line: dict[str, Any] = {"failed": failed}
    if run.error is not None:
        line["error"] = run.error
    if entry.legal:
        return line
    capabilities = set(run.data.get("capabilities", ()))
    lacking = [cap for cap in entry.needs if cap not in capabilities]
    line["breaks"] = list(entry.breaks)
    if run.error is not None:
        line["verdict"] = SURVIVED
    elif set(failed) & set(entry.breaks):
        line["verdict"] = CAUGHT
        # Diagnosis: the rules it breaks that the verdict did not fail (a rule no scenario could run here is
        # not counted against it).
        missed = [r for r in entry.breaks if r not in failed and r not in skipped_rules(run.data)]
        line["missed"] = missed
        line["caught_under"] = "some" if missed else "all"
    elif failed:
        line["verdict"] = OTHER
    elif lacking or set(entry.breaks) <= skipped_rules(run.data):  # nothing here could show the bug
        line["verdict"] = NOT_APPLICABLE
        if lacking:
            line["lacking"] = lacking
    else:
        line["verdict"] = SURVIVED
    return line


def model_line(run: Run) -> dict[str, Any]:
    model = run.data.get("model") or {}
    divergences = model.get("divergences", [])
    line: dict[str, Any] = {"sequences": model.get("sequences", 0), "divergences": len(divergences)}
    if divergences:
        first = divergences[0]
        line["first"] = f"{first.get('side')}: {first.get('message')}"
    if run.error is not None or "model" not in run.data:
        line["error"] = run.error or f"no model result (see {run.log})"
    return line


def failures(result: Mapping[str, Any]) -> list[str]:
    """What makes the run fail: one line each."""
    out = []
    if result["baseline"]["failed"]:
        out.append(f"the suite fails {', '.join(result['baseline']['failed'])} without any entry")
    if result["baseline"].get("error"):
        out.append(f"the baseline run failed: {result['baseline']['error']}")
    for name, line in result["mutants"].items():
        if line["verdict"] not in (CAUGHT, NOT_APPLICABLE):
            where = f" (failed {', '.join(line['failed'])} only)" if line["failed"] else ""
            out.append(f"{name}: {line['verdict']}{where}, breaks {', '.join(line['breaks'])}"
                       + (f": {line['error']}" if "error" in line else ""))
    for name, line in result["legal"].items():
        if line["failed"] or "error" in line:
            out.append(f"legal variant {name} fails {', '.join(line['failed']) or 'to run'}"
                       + (f": {line['error']}" if "error" in line else ""))
    for name, line in result.get("model", {}).items():
        if name in result["legal"] and (line["divergences"] or "error" in line):
            out.append(f"legal variant {name}: the model found {line['divergences']} divergence(s)"
                       + (f": {line.get('first') or line.get('error')}"))
    return out


def matrix(result: Mapping[str, Any]) -> list[str]:
    """The kill matrix: an entry per row, a rule per column. ``X`` failed a rule it breaks, ``x`` a rule it does
    not claim, ``.`` a rule it breaks that passed; ``!`` a rule a legal variant failed."""
    name_width = max([len(n) for n in (*result["mutants"], *result["legal"])] + [10])
    head = f"{'entry':<{name_width}}  " + " ".join(f"{r:>3}" for r in RULE_IDS) + "  verdict"
    lines = [head, "-" * len(head)]
    models = result.get("model", {})
    for name, line in result["mutants"].items():
        cells = []
        for rule in RULE_IDS:
            breaks, failed = rule in line["breaks"], rule in line["failed"]
            cells.append("X" if breaks and failed else "x" if failed else "." if breaks else " ")
        found = models.get(name)
        model = f", model: {found['divergences']} divergence(s)" if found is not None else ""
        under = ""
        if line["verdict"] == CAUGHT:
            missed = line.get("missed", [])
            under = f" under some (not {', '.join(missed)})" if missed else " under all"
        lines.append(f"{name:<{name_width}}  " + " ".join(f"{c:>3}" for c in cells)
                     + f"  {line['verdict']}{under}{model}")
    for name, line in result["legal"].items():
        cells = ["!" if rule in line["failed"] else " " for rule in RULE_IDS]
        found = models.get(name)
        model = f", model: {found['divergences']} divergence(s)" if found is not None else ""
        state = "passed" if not line["failed"] and "error" not in line else "FAILED"
        lines.append(f"{name:<{name_width}}  " + " ".join(f"{c:>3}" for c in cells) + f"  legal: {state}{model}")
    return lines


def run_corpus(entries: Sequence[Entry], out: Path, backend: Sequence[str], extra: Sequence[str], *, jobs: int,
               timeout: float, model: Sequence[str] | None, say: Callable[[str], None], focus: bool = False,
               baseline: Path | None = None) -> dict[str, Any]:
    """Run the baseline and every entry (and the model on each with ``model``: its extra pytest arguments).

    ``focus``: a bug runs only the scenarios of the rules it breaks (``--san-rules``), a legal variant all of
    them. ``baseline``: the report of a suite run already made on the same providers, instead of a new one."""
    out.mkdir(parents=True, exist_ok=True)
    base = Run(BASELINE, None, baseline or out / f"{BASELINE}.json", out / f"{BASELINE}.log")
    runs = [Run(e.name, e.module, out / f"{e.name}.json", out / f"{e.name}.log") for e in entries]
    model_runs = [] if model is None else [Run(e.name, e.module, out / f"{e.name}.model.json",
                                               out / f"{e.name}.model.log") for e in entries]

    def only(entry: Entry) -> list[str]:
        return [f"--san-rules={','.join(entry.breaks)}"] if focus and not entry.legal else []

    work = [(run, pytest_argv(run, "pytest_san.scenarios", backend, [*only(e), *extra]))
            for run, e in zip(runs, entries, strict=True)]
    if baseline is None:
        work.insert(0, (base, pytest_argv(base, "pytest_san.scenarios", backend, extra)))
    else:
        base.exit_status, base.data = 0, load_report(baseline)
    work += [(run, pytest_argv(run, "pytest_san.model", backend, [*(model or ()), *extra])) for run in model_runs]
    path = list(dict.fromkeys(e.path for e in entries if e.path is not None))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(execute, run, argv, timeout, path): run for run, argv in work}
        for done in concurrent.futures.as_completed(futures):
            run = done.result()
            state = run.error or f"failed {', '.join(sorted(failed_rules(run.data), key=RULE_IDS.index)) or 'nothing'}"
            say(f"san-hil mutants: {run.name}{' (model)' if run in model_runs else ''}: {state}")
    failed_before = failed_rules(base.data)
    result: dict[str, Any] = {
        "backend": base.data.get("backend", ""),
        "capabilities": base.data.get("capabilities", []),
        "baseline": {"failed": sorted(failed_before, key=RULE_IDS.index),
                     **({"error": base.error} if base.error else {})},
        "mutants": {}, "legal": {},
    }
    for entry, run in zip(entries, runs, strict=True):
        result["legal" if entry.legal else "mutants"][entry.name] = verdict(entry, run, failed_before)
    if model is not None:
        result["model"] = {entry.name: model_line(run) for entry, run in zip(entries, model_runs, strict=True)}
    (out / "mutants.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def entries_in_play(plugins: Sequence[str], with_corpus: bool, only: str | None) -> list[Entry]:
    """The entries to run: the author's ``plugins`` (with ``with_corpus``, the shipped corpus after them), or
    the shipped corpus alone when there are none; ``only`` picks among them. A ValueError says what is wrong."""
    mine = plugin_entries(plugins)
    shipped = corpus() if with_corpus or not plugins else []
    clash = sorted({e.name for e in mine} & {e.name for e in shipped})
    if clash:
        raise ValueError(f"--plugin: {', '.join(clash)}: the shipped corpus has an entry of that name "
                         f"(rename yours, or leave out --corpus)")
    where = ("in the mutation corpus" if not plugins else "among the --plugin modules" if not shipped
             else "among the --plugin modules and the mutation corpus")
    names = [n for n in only.split(",") if n] if only else None
    try:
        return select(names, [*mine, *shipped], where)
    except ValueError as exc:
        unknown = [n for n in names or () if n not in {e.name for e in mine}]
        if plugins and not shipped and any(e.name in unknown for e in corpus()):
            raise ValueError(f"{exc}; with --plugin the shipped corpus runs only with --corpus") from None
        raise
