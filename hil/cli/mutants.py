"""``san-hil mutants``: the conformance suite against every entry of the mutation corpus (``pytest_san.mutants``),
or against an author's own (``--plugin``), on the emulator or on an inventory's hosts, and the kill matrix of
what it caught.

The runner, its verdicts and ``mutants.json`` are :mod:`pytest_san.mutants.runner`; here are the command's
options and what it prints: the kill matrix, one line of totals, and what makes the run fail.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from hil.cli.arguments import INVENTORY_HELP
from pytest_san.mutants.runner import CAUGHT, NOT_APPLICABLE, entries_in_play, failures, matrix, run_corpus
from pytest_san.report import load_report

__all__ = ["add_mutants_command"]


def _run(args: argparse.Namespace) -> int:
    try:
        entries = entries_in_play(args.plugin or [], args.corpus, args.only)
    except ValueError as exc:  # PluginError too
        print(f"san-hil mutants: {exc}", file=sys.stderr)
        return 2
    backend: list[str] = []
    if args.inventory:
        inventory = Path(args.inventory)
        if not inventory.is_file():
            print(f"san-hil mutants: --inventory {inventory}: no such file", file=sys.stderr)
            return 2
        backend = ["--san-backend=hil", f"--san-inventory={inventory.resolve()}"]
        if args.limit:
            backend.append(f"--san-hosts={args.limit}")
    jobs = args.jobs if args.jobs is not None else (1 if args.inventory else (os.cpu_count() or 1))
    model = None
    if args.model:
        model = [f"--san-model-sequences={args.model_sequences}", f"--san-model-steps={args.model_steps}"]
        if args.model_seed is not None:
            model.append(f"--san-model-seed={args.model_seed}")
    out = Path(args.out)
    yours = sum(1 for e in entries if e.path is not None)
    print(f"san-hil mutants: {len(entries)} entries{f' ({yours} from --plugin)' if yours else ''} on "
          f"{'the inventory hosts' if backend else 'the emulator'}, "
          f"{jobs} at a time; results in {out}", file=sys.stderr, flush=True)
    baseline = Path(args.baseline) if args.baseline else None
    if baseline is not None and not load_report(baseline).get("rules"):
        print(f"san-hil mutants: --baseline {baseline}: not a conformance report (--san-report JSON)", file=sys.stderr)
        return 2
    result = run_corpus(entries, out, backend, args.extra_args, jobs=jobs, timeout=args.timeout, model=model,
                        say=lambda line: print(line, file=sys.stderr, flush=True), focus=args.focus,
                        baseline=baseline)
    for line in matrix(result):
        print(line)
    problems = failures(result)
    caught = sum(1 for line in result["mutants"].values() if line["verdict"] == CAUGHT)
    applicable = sum(1 for line in result["mutants"].values() if line["verdict"] != NOT_APPLICABLE)
    under_all = sum(1 for line in result["mutants"].values() if line.get("caught_under") == "all")
    print(f"\n{caught} of {applicable} applicable bugs caught under a rule they break, {under_all} of them under "
          f"every rule they break ({len(result['mutants']) - applicable} not applicable on "
          f"{result['backend'] or 'this backend'}); "
          f"{sum(1 for line in result['legal'].values() if not line['failed'])} of {len(result['legal'])} "
          f"legal variants passed; written to {out / 'mutants.json'}")
    for problem in problems:
        print(f"san-hil mutants: {problem}")
    return 1 if problems else 0


def _seconds(text: str) -> float:
    """A time limit: a finite number of seconds above zero (argparse shows the error with the option's name)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text!r}")
    return value


def add_mutants_command(commands: Any) -> None:
    parser = commands.add_parser(
        "mutants", help="run the conformance suite against the shipped mutation corpus (or your own planted bugs: "
             "--plugin) and print the kill matrix",
        description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--inventory", default=None, help=f"run on these hosts (hil) instead of the emulator; "
                                                          f"{INVENTORY_HELP}")
    parser.add_argument("--limit", default=None, metavar="NAMES", help="with --inventory: the hosts to use "
                                                                       "(comma-separated names; default: all)")
    parser.add_argument("--plugin", action="append", default=None, metavar="MODULE",
                        help="run your own entry instead of the shipped corpus: a plugin module importable from "
                             "here or PYTHONPATH, a .py file, or a directory (each module in it); its BREAKS names "
                             "the rules it breaks, none for a legal variant (repeatable)")
    parser.add_argument("--corpus", action="store_true",
                        help="with --plugin: run the shipped corpus too (without --plugin it is what runs)")
    parser.add_argument("--only", default=None, metavar="NAME,...",
                        help="run only these entries (of the corpus, or of the --plugin modules)")
    parser.add_argument("--out", default="mutants", metavar="DIR", help="where mutants.json, each entry's report "
                                                                        "and log go (default: ./mutants)")
    parser.add_argument("--jobs", type=_count, default=None, metavar="N",
                        help="suite runs at once (default: the CPU count on the emulator, 1 on hosts)")
    parser.add_argument("--timeout", type=_seconds, default=1800.0, metavar="SECONDS",
                        help="give up on one run after this long (default: 1800)")
    parser.add_argument("--focus", action="store_true",
                        help="run each bug only on the scenarios of the rules it breaks (--san-rules): faster, but a "
                             "bug caught only under another rule then survives")
    parser.add_argument("--baseline", default=None, metavar="REPORT",
                        help="the --san-report JSON of a suite run on the same providers and hosts, instead of "
                             "running the baseline again")
    parser.add_argument("--model", action="store_true", help="also run the reference model against each entry")
    parser.add_argument("--model-sequences", type=int, default=50, metavar="N",
                        help="with --model: sequences per entry (default: 50)")
    parser.add_argument("--model-steps", type=int, default=20, metavar="N",
                        help="with --model: steps per sequence (default: 20)")
    parser.add_argument("--model-seed", type=int, default=None, metavar="N", help="with --model: the seed")
    parser.set_defaults(run=_run, accepts_extra_args=True)
