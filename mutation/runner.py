"""``python -m mutation``: mutmut on the reference implementations, the conformance run as the test command,
every surviving non-message mutant held to mutation/survivors.md (docs/mutation.md)."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import results, select, triage
from .messages import MessageRules

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIG = HERE / "mutmut.toml"
SURVIVORS = HERE / "survivors.md"


def load_config(path: Path) -> dict[str, Any]:
    """The TOML file's tables ``tool.mutmut`` and ``tool.san-mutation``."""
    text = path.read_text(encoding="utf-8")
    if sys.version_info >= (3, 11):
        import tomllib
        data = tomllib.loads(text)
    else:  # pragma: no cover - mutmut itself needs the toml package on 3.10
        import toml  # type: ignore[import-untyped]
        data = toml.loads(text)
    tool = data.get("tool", {})
    if "mutmut" not in tool:
        raise ValueError(f"{path}: no [tool.mutmut] table")
    return {"mutmut": tool["mutmut"], "san-mutation": tool.get("san-mutation", {})}


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ValueError(f"[tool.mutmut]: cannot write {value!r:.60} back as TOML")


def mutmut_pyproject(table: dict[str, Any]) -> str:
    """The pyproject.toml mutmut reads in the work directory: the [tool.mutmut] table, as given."""
    return "[tool.mutmut]\n" + "".join(f"{key} = {_toml_value(value)}\n" for key, value in table.items())


def prepare(work: Path, table: dict[str, Any], fresh: bool, links: Sequence[str] = ()) -> None:
    """The work directory: mutmut's config, and the package it copies (a link to the checkout's), with ``links``
    (more of the checkout's folders: ``tests``, which mutmut copies beside the mutants)."""
    work.mkdir(parents=True, exist_ok=True)
    if fresh and (work / "mutants").exists():
        shutil.rmtree(work / "mutants")
    (work / "pyproject.toml").write_text(mutmut_pyproject(table), encoding="utf-8")
    for source in [*table.get("source_paths", []), *links]:
        link = work / source
        if not link.is_symlink():
            if link.exists():
                raise SystemExit(f"mutation: {link} exists and is not the link to {ROOT / source}: remove it")
            link.symlink_to(ROOT / source, target_is_directory=True)


def mutmut(work: Path, args: list[str], quiet: bool = False) -> int:
    """``mutmut ARGS`` in the work directory (the venv's mutmut, beside this Python)."""
    exe = Path(sys.executable).with_name("mutmut")
    command = [str(exe) if exe.exists() else "mutmut", *args]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.DEVNULL if quiet else None
    return subprocess.run(command, cwd=work, env=env, stdout=out, stderr=out, check=False).returncode


def all_mutant_names(work: Path) -> list[str]:
    names: list[str] = []
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        names += json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
    return names


def generate(work: Path, max_children: int) -> list[str]:
    """Make the mutants and mutmut's record of which test reaches which function, without running a mutant:
    ``mutmut run`` asked for a mutant that does not exist makes them, then stops at the name. The names, from
    what it wrote."""
    mutmut(work, ["run", "--max-children", str(max_children), "mutation-generate-only"], quiet=True)
    names = all_mutant_names(work)
    if not names:
        raise SystemExit(f"mutation: mutmut made no mutants in {work} (run it there by hand to see why)")
    return names


def run_together(stats: dict[str, Any], patterns: list[str]) -> int:
    """mutmut runs a mutant against the tests that reached its function while it recorded who calls what. A
    session fixture's work is recorded under the one test that first asked for it: the model, run once for all
    its tests, would be recorded under the first (R1) alone, and a divergence only another rule's test fails
    would go unseen. So every function that any test matching a pattern reached gets all the tests matching it.
    Returns how many functions gained tests."""
    known = list(stats["duration_by_test"])
    widened = 0
    for pattern in patterns:
        group = {t for t in known if fnmatch.fnmatchcase(t, pattern)}
        for tests in stats["tests_by_mangled_function_name"].values():
            if group & set(tests) and not group <= set(tests):
                tests[:] = sorted(set(tests) | group)
                widened += 1
    return widened


def run_all_for(stats: dict[str, Any], patterns: list[str]) -> int:
    """Functions that run while the session's fixtures are built (the backend's constructors) are recorded
    under the session's first test alone, yet every test uses what they built: their mutants get every test.
    ``patterns`` match mutmut's names for functions (``pytest_san.spi.emulator.proxy.xǁEmulatedProxyǁ__init__``).
    Returns how many functions gained tests."""
    everything = sorted(stats["duration_by_test"])
    widened = 0
    for function, tests in stats["tests_by_mangled_function_name"].items():
        if any(fnmatch.fnmatchcase(function, p) for p in patterns) and len(tests) < len(everything):
            tests[:] = everything
            widened += 1
    return widened


def keep_to(stats: dict[str, Any], only_for: dict[str, str]) -> int:
    """Tests that judge one file's code alone: each test matching a key of ``only_for`` is kept only for the
    functions matching its value (the batch API's unit tests for ``pytest_san.batch``: they would kill the
    emulator's mutants too, which the conformance run alone is to judge). Returns how many functions lost tests."""
    narrowed = 0
    for function, tests in stats["tests_by_mangled_function_name"].items():
        kept = [t for t in tests if all(not fnmatch.fnmatchcase(t, test) or fnmatch.fnmatchcase(function, code)
                                        for test, code in only_for.items())]
        if len(kept) < len(tests):
            tests[:] = kept
            narrowed += 1
    return narrowed


def widen(work: Path, together: list[str], everything_for: list[str], only_for: dict[str, str]) -> None:
    path = work / "mutants" / "mutmut-stats.json"
    if not path.exists():
        return
    stats = json.loads(path.read_text(encoding="utf-8"))
    if run_together(stats, together) + run_all_for(stats, everything_for) + keep_to(stats, only_for):
        path.write_text(json.dumps(stats, indent=1), encoding="utf-8")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mutation", description=__doc__)
    p.add_argument("--changed", metavar="BASE",
                   help="mutate only the files changed since BASE (a git ref: origin/main, HEAD~3); none changed, or "
                        "git cannot tell: a seeded sample instead (--sample)")
    p.add_argument("--sample", metavar="N", type=int, default=None,
                   help="run N mutants drawn with --seed (default: all of them; with --changed, the sample taken "
                        "when no mutated file changed: 300)")
    p.add_argument("--budget", metavar="N", type=int, default=500,
                   help="with --changed: at most N mutants of the changed files, drawn with --seed (default 500)")
    p.add_argument("--seed", type=int, default=1, help="the sample's seed (default 1)")
    p.add_argument("--max-children", type=int, default=2, help="mutmut's worker processes (default 2)")
    p.add_argument("--work", type=Path, default=HERE / "work",
                   help="mutmut's work directory: its pyproject.toml and mutants/ (default mutation/work)")
    p.add_argument("--config", type=Path, default=CONFIG, help="the configuration (default mutation/mutmut.toml)")
    p.add_argument("--survivors", type=Path, default=SURVIVORS,
                   help="the triage file (default mutation/survivors.md)")
    p.add_argument("--file", metavar="GLOB", action="append", default=[], dest="files",
                   help="mutate only the files of only_mutate that match (repeatable): one file's first run")
    p.add_argument("--again", action="store_true",
                   help="in the work directory of an earlier run: run again only its surviving non-message mutants "
                        "(and those of functions changed since), against the scenarios as they are now")
    p.add_argument("--only", metavar="GLOB", action="append", default=[],
                   help="with --again: only the mutants whose mutmut names match (repeatable), e.g. "
                        "'pytest_san.switch.*'")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: judge what the work directory holds from an earlier run")
    p.add_argument("--write-untriaged", action="store_true",
                   help="add an *untriaged* entry to the triage file for every untriaged survivor")
    p.add_argument("--json", type=Path, default=None, help="also write the numbers and survivors here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = load_config(args.config)
    table = dict(config["mutmut"])
    ours = dict(config["san-mutation"])
    together, everything_for = ours.pop("run_together", []), ours.pop("run_all_tests_for", [])
    links, only_for = ours.pop("links", []), ours.pop("only_for", {})
    if not isinstance(links, list) or not all(isinstance(p, str) for p in links):
        raise SystemExit(f"mutation: {args.config}: [tool.san-mutation] links must be a list of strings")
    if not isinstance(only_for, dict) or not all(isinstance(v, str) for v in only_for.values()):
        raise SystemExit(f"mutation: {args.config}: [tool.san-mutation] only_for must map test patterns to "
                         f"function patterns")
    for key, value in (("run_together", together), ("run_all_tests_for", everything_for)):
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise SystemExit(f"mutation: {args.config}: [tool.san-mutation] {key} must be a list of strings")
    rules = MessageRules.from_table(ours, f"{args.config}: [tool.san-mutation]")
    survivors = triage.load(args.survivors)  # malformed: fail before the long part
    if args.files:
        table["only_mutate"] = [path for path in table.get("only_mutate", [])
                                if any(fnmatch.fnmatchcase(path, p) for p in args.files)]
        if not table["only_mutate"]:
            raise SystemExit(f"mutation: no file of only_mutate in {args.config} matches {args.files}")
    started = time.monotonic()
    names: list[str] = []
    if args.again and not args.report_only:
        prepare(args.work, table, fresh=False, links=links)
        # mutmut's record of which test reaches which function, made anew: code changed since (a new
        # function) is reached by tests the old record does not know of. The verdicts are kept.
        (args.work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
        generate(args.work, args.max_children)  # the scenarios copied afresh, changed functions' mutants remade
        widen(args.work, together, everything_for, only_for)
        names = [m.name for m in results.read_run(args.work / "mutants", rules)
                 if not m.message_only and m.status in (results.SURVIVED, results.NOT_RUN)
                 and (not args.only or any(fnmatch.fnmatchcase(m.name, p) for p in args.only))]
        print(f"mutation: again: {len(names)} mutants")
        if names:
            code = mutmut(args.work, ["run", "--max-children", str(args.max_children), *names])
            if code != 0:
                print(f"mutation: mutmut run exited {code}", file=sys.stderr)
                return 2
        names = []  # judge the whole run
    elif not args.report_only:
        sample_size = args.sample
        if args.changed:
            files = select.changed_files(ROOT, args.changed)
            targets = select.mutated_among(files or [], table.get("only_mutate", []))
            if files is None:
                print(f"mutation: git cannot tell what changed since {args.changed}: a seeded sample")
            elif not targets:
                print(f"mutation: no mutated file changed since {args.changed}: a seeded sample")
            else:
                print(f"mutation: changed since {args.changed}: {', '.join(targets)}")
                table["only_mutate"] = targets
            # The changed files' mutants up to --budget; none changed: --sample of them all (300 by default).
            sample_size = args.budget if targets else (300 if args.sample is None else args.sample)
        prepare(args.work, table, fresh=True, links=links)
        pool = generate(args.work, args.max_children)
        widen(args.work, together, everything_for, only_for)
        if sample_size is not None:
            names = select.sample(pool, sample_size, args.seed)
            print(f"mutation: {len(names)} of {len(pool)} mutants (seed {args.seed})")
        code = mutmut(args.work, ["run", "--max-children", str(args.max_children), *names])
        if code != 0:
            print(f"mutation: mutmut run exited {code}", file=sys.stderr)
            return 2
    mutants = results.read_run(args.work / "mutants", rules)
    if names:
        chosen = set(names)
        mutants = [m for m in mutants if m.name in chosen]
    verdict = results.judge(mutants, survivors)
    elapsed = time.monotonic() - started
    lines = results.table(verdict)
    print("\n".join(lines))
    if not args.report_only:
        print(f"mutation: {len(mutants)} mutants in {elapsed:.0f} s with {args.max_children} worker(s)")
    for m in verdict.untriaged:
        print(f"mutation: UNTRIAGED survivor {m.path} {m.function} {m.key} ({m.name}): {m.change}")
    for m, entry in verdict.reopened:
        print(f"mutation: SURVIVES AGAIN {m.path} {m.function} {m.key} (closed {entry.text}): {m.change}")
    if args.write_untriaged and verdict.untriaged:
        text = args.survivors.read_text(encoding="utf-8") if args.survivors.exists() else "# Surviving mutants\n"
        args.survivors.write_text(triage.add_untriaged(text, [
            triage.NewEntry(m.path, m.function, m.key, m.change) for m in verdict.untriaged]), encoding="utf-8")
        print(f"mutation: {len(verdict.untriaged)} untriaged entries added to {args.survivors}")
    if args.json:
        total = verdict.total()
        args.json.write_text(json.dumps({
            "seconds": round(elapsed), "max_children": args.max_children,
            "by_file": {p: vars(c) for p, c in verdict.by_file.items()}, "total": vars(total),
            "survivors": [vars(m) for m in mutants if not m.message_only and m.status == results.SURVIVED],
        }, indent=1), encoding="utf-8")
    if verdict.failed:
        print(f"mutation: FAILED: {len(verdict.untriaged)} untriaged survivor(s), {len(verdict.reopened)} closed "
              f"one(s) alive again (triage them in {args.survivors})", file=sys.stderr)
        return 1
    return 0
