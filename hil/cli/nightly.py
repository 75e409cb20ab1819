"""``san-hil nightly``: its options and its run (the job itself is :mod:`hil.nightly.job`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hil.cli.arguments import INVENTORY_HELP
from hil.cli.console import print_safely
from hil.controller.leases import DEFAULT_LEASE_TIMEOUT
from hil.nightly.job import NightlyOptions, nightly
from hil.nightly.model import STEPS, TOTAL_SEQUENCES, ModelOptions

__all__ = ["add_nightly_command"]


def add_nightly_command(commands: Any) -> None:
    """``san-hil nightly`` on ``san-hil``'s subparsers."""
    p = commands.add_parser(
        "nightly", allow_abbrev=False,
        usage="san-hil nightly --inventory PATH --out DIR [options] [-- pytest args ...]",
        help="the suite, then the reference model, on every host (pair) of the inventory, in parallel; "
             "index.html, junit.xml, report.json, summary.md, bandwidth.png in --out (pytest's arguments after --)")
    p.add_argument("--inventory", required=True, type=Path, help=INVENTORY_HELP)
    p.add_argument("--out", required=True, type=Path, help="directory for the results")
    p.add_argument("--group", default="san", help="inventory group (default: san)")
    p.add_argument("--limit", dest="hosts", default=None, metavar="NAMES", help="comma-separated host names to use")
    p.add_argument("--jobs", type=int, default=None, help="host sets run at once (default: all)")
    p.add_argument("--lease-timeout", type=float, default=DEFAULT_LEASE_TIMEOUT,
                   help=f"wait this long for hosts leased by other runs (default {DEFAULT_LEASE_TIMEOUT:g} s)")
    p.add_argument("--no-bandwidth", dest="bandwidth", action="store_false",
                   help="skip the RDMA bandwidth measurement on verbs hosts")
    _model_arguments(p)
    p.set_defaults(run=_run, accepts_extra_args=True)


def _model_arguments(p: Any) -> None:
    """The reference model's budget (pytest_san.model's --san-model-* for each host set's run)."""
    p.add_argument("--model-sequences", type=int, default=TOTAL_SEQUENCES, metavar="N",
                   help=f"model sequences in all, split evenly over the host sets (default {TOTAL_SEQUENCES}: "
                        f"ceil({TOTAL_SEQUENCES} / sets) each)")
    p.add_argument("--model-steps", type=int, default=STEPS, metavar="N",
                   help=f"steps per model sequence (default {STEPS})")
    p.add_argument("--model-deadline", type=float, default=None, metavar="SECONDS",
                   help="no host set's model run starts a sequence after SECONDS (default: none)")
    p.add_argument("--model-seed", type=int, default=None, metavar="N",
                   help="the model's seed on every host set, to replay a run (default: each draws its own, "
                        "shown in summary.md)")
    p.add_argument("--model-differential", action="store_true",
                   help="also run every model step on a fresh emulator and compare the answers")
    p.add_argument("--no-model", dest="model", action="store_false", help="run the suite only, not the model")


def _model_options(args: Any) -> ModelOptions | None:
    if not args.model:
        return None
    for name in ("model_sequences", "model_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.model_deadline is not None and args.model_deadline <= 0:
        raise ValueError("--model-deadline must be positive")
    return ModelOptions(sequences=args.model_sequences, steps=args.model_steps, deadline=args.model_deadline,
                        seed=args.model_seed, differential=args.model_differential)


def _run(args: Any) -> int:
    extra = list(getattr(args, "extra_args", []))
    while extra[:1] == ["--"]:
        extra = extra[1:]
    if args.jobs is not None and args.jobs < 1:
        print_safely("san-hil nightly: --jobs must be at least 1", sys.stderr)
        return 2
    try:
        opts = NightlyOptions(inventory=args.inventory, out=args.out, group=args.group,
                              hosts=args.hosts.split(",") if args.hosts else None, jobs=args.jobs,
                              lease_timeout=args.lease_timeout, bandwidth=args.bandwidth, pytest_args=extra)
        opts.model = _model_options(args)
        return nightly(opts)
    except ValueError as exc:  # InventoryError included
        print_safely(f"san-hil nightly: {exc}", sys.stderr)
        return 2


