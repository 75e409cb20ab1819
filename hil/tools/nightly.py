"""``san-hil nightly``: the conformance suite and the reference model on every host (pair) of an inventory.

Per host set (a self-sufficient host alone, verbs hosts in pairs) one pytest subprocess runs the whole
suite on the set with ``--san-hosts`` (conformance per host, which one pytest ``-n`` run spreading
tests over the hosts would not give), then another runs ``pytest_san.model`` there with nightly's larger
budget. Runs go in parallel up to ``--jobs``; two runs sharing a host (a set's suite and model, or the
odd verbs host out paired with its predecessor) never run at once, and the hosts' leases keep other
runs off them. Then, on verbs pairs, RDMA write bandwidth (harness and ib_write_bw). Writes into
``--out``: ``index.html`` (the whole night on one page, :mod:`hil.tools.nightly_index`), ``junit.xml`` (one
testsuite per run), ``report.json`` (conformance per set and rule, the model per set), ``summary.md`` (read in
ten seconds) and ``bandwidth.png``; each run's pytest-html report where pytest-html is installed.

The parts: :mod:`hil.tools.nightly_plan` (the host sets), :mod:`hil.tools.nightly_runs` (running
their pytest), :mod:`hil.tools.nightly_results` (junit.xml, report.json entries, summary.md),
:mod:`hil.tools.nightly_model` (the model's budget, arguments and results); here the bandwidth
measurement and the command that ties them together. Every file is written as UTF-8 (or ASCII), and
every terminal line survives an ASCII locale (issue 12: a check mark once crashed nightly before it
wrote its results).

Progress (each run started and finished, the model's verdict, the files written) is logged as INFO records
of this module's logger, ``hil.tools.nightly``, so pytest's ``log_cli`` and ``--log-file`` or any handler
see it; ``san-hil`` shows them on stderr through the handler its entry point adds (:mod:`hil.tools.console`,
on streams that escape what the locale cannot show). Its lines are ASCII in any case ("ok"/"FAILED").
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hil.controller.leases import DEFAULT_LEASE_TIMEOUT, now_iso
from hil.inventory import load_inventory
from hil.tools.arguments import INVENTORY_HELP
from hil.tools.nightly_index import write_index
from hil.tools.nightly_model import STEPS, TOTAL_SEQUENCES, ModelOptions, model_args, model_report, plugin_args
from hil.tools.nightly_plan import HostSet, host_sets
from hil.tools.nightly_results import merge_junit, render_summary, set_report
from hil.tools.nightly_runs import SetRun, pytest_argv, run_sets
from pytest_san.report import RULE_IDS

log = logging.getLogger(__name__)


def _progress(line: str) -> None:
    """One progress line, as a record of nightly's logger (the handler decides where it shows)."""
    log.info("%s", line)


# --- the terminal ----------------------------------------------------------------------------------------


def print_safely(line: str, stream: TextIO | None = None) -> None:
    """Print ``line`` whatever the stream's encoding (LC_ALL=C, PYTHONIOENCODING=ascii): what it cannot
    show is escaped. A progress line never stops a run that has results to write (issue 12)."""
    stream = stream if stream is not None else sys.stdout
    encoding = getattr(stream, "encoding", None) or "ascii"
    try:
        stream.write(line.encode(encoding, "backslashreplace").decode(encoding) + "\n")
        stream.flush()
    except (LookupError, OSError, ValueError):  # an unknown codec, a closed pipe or file
        pass


# --- bandwidth ----------------------------------------------------------------------------------------


def measure_bandwidth(hs: HostSet, lease_timeout: float, say: Callable[[str], None]) -> dict[str, Any]:
    """Harness and ib_write_bw across a verbs set (a loopback host: to itself), with the set leased."""
    from hil.controller.backend import HilBackend
    from hil.controller.leases import LeasePolicy, LeaseRequest
    from hil.tools.bandwidth import has_ib_write_bw, measure_harness, measure_ib_write_bw

    entry: dict[str, Any] = {"hosts": hs.names, "harness": [], "ib_write_bw": []}
    say(f"nightly: {hs.name}: measuring RDMA write bandwidth")
    policy = LeasePolicy(request=LeaseRequest(worker="nightly-bandwidth"), timeout=lease_timeout, notify=say)
    try:
        backend = HilBackend(list(hs.hosts), leases=policy)
    except Exception as exc:
        entry["harness_error"] = entry["ib_write_bw_error"] = f"{type(exc).__name__}: {exc}"
        return entry
    try:
        try:
            entry["harness"] = [{"bytes": b, "gbps": g} for b, g in measure_harness(backend)]
        except Exception as exc:
            entry["harness_error"] = f"{type(exc).__name__}: {exc}"
        client, server = backend.agents[0], backend.agents[-1]
        try:
            if not (has_ib_write_bw(client) and has_ib_write_bw(server)):
                entry["ib_write_bw_missing"] = "ib_write_bw is not installed on the hosts (apt-get install perftest)"
            else:
                entry["ib_write_bw"] = [{"bytes": b, "gbps": g} for b, g in measure_ib_write_bw(client, server)]
        except Exception as exc:
            entry["ib_write_bw_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        backend.close()
    return entry


# --- the command --------------------------------------------------------------------------------------


@dataclass
class NightlyOptions:
    inventory: Path
    out: Path
    group: str = "san"
    hosts: list[str] | None = None
    jobs: int | None = None
    lease_timeout: float = DEFAULT_LEASE_TIMEOUT
    bandwidth: bool = True
    pytest_args: list[str] = dataclasses.field(default_factory=list)
    model: ModelOptions | None = dataclasses.field(default_factory=ModelOptions)  # None: --no-model


def out_directory(given: Path, option: str) -> Path:
    """``given``, resolved and made if missing; ValueError naming ``option`` and the path if it cannot be."""
    out = given.resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"{option} {given}: {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{option} {given}: cannot create {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {given}: {out} is not writable")
    return out


def nightly(opts: NightlyOptions) -> int:
    """Run it all and write the files; 0 only when every set passed, the model found no divergence
    and every measurement worked. Progress: records of ``hil.tools.nightly``."""
    say = _progress
    inventory = opts.inventory.resolve()
    hosts = load_inventory(inventory).select(opts.group, opts.hosts)
    sets = host_sets(hosts)
    out = out_directory(opts.out, "--out")
    suites = [SetRun(hs, out / "hosts" / hs.slug) for hs in sets]
    for run in suites:
        run.argv = pytest_argv(run, inventory, opts.group, opts.lease_timeout, opts.pytest_args)
    # The model after the suite on the same hosts: run_sets never starts it while its set's suite runs.
    models: list[SetRun] = []
    per_set = opts.model.per_set(len(sets)) if opts.model else 0
    extra = model_args(opts.model, per_set, opts.pytest_args) if opts.model else []
    for hs in sets if opts.model else []:
        models.append(run := SetRun(hs, out / "hosts" / hs.slug / "model", kind="model"))
        run.argv = pytest_argv(run, inventory, opts.group, opts.lease_timeout, extra)
    for run in suites + models:
        for stale in (run.junit, run.report, run.failures, run.html):
            stale.unlink(missing_ok=True)
    started, began = now_iso(), time.monotonic()
    jobs = max(1, opts.jobs or len(sets))
    model_text = (f"then the model, {per_set} sequences of {opts.model.steps} steps on each"
                  if opts.model else "no model (--no-model)")
    say(f"nightly: {len(sets)} host set(s) from {inventory} group {opts.group}: "
        f"{', '.join(hs.name for hs in sets)}; the suite, {model_text}; {jobs} at a time")
    run_sets(suites + models, jobs, say)

    report: dict[str, Any] = {
        "inventory": str(inventory), "group": opts.group, "pytest_args": list(opts.pytest_args),
        "hosts": {run.set.name: set_report(run) for run in suites},
    }
    failed = any(entry["status"] != "passed" for entry in report["hosts"].values())
    report["model"], report["model_note"] = None, "Not run (--no-model)."
    if opts.model:
        report["model"] = model_report(models, opts.model, per_set, str(inventory), opts.group,
                                       plugin_args(opts.pytest_args))
        report["model_note"] = None
        failed |= report["model"]["status"] != "passed"

    verbs_sets = [hs for hs in sets if hs.verbs]
    report["bandwidth"] = None
    report["bandwidth_png"] = False
    if not verbs_sets:
        report["bandwidth_note"] = ("No verbs hosts in the inventory: no RDMA bandwidth measured, "
                                    "bandwidth.png not written.")
    elif not opts.bandwidth:
        report["bandwidth_note"] = "Bandwidth not measured (--no-bandwidth): bandwidth.png not written."
    else:
        from hil.tools.bandwidth import plot_bandwidth

        measured = {hs.name: measure_bandwidth(hs, opts.lease_timeout, say) for hs in verbs_sets}
        report["bandwidth"] = measured
        failed |= any(e.get("harness_error") or e.get("ib_write_bw_error") for e in measured.values())
        notes = [f"{name}: {e['ib_write_bw_missing']}" for name, e in measured.items() if e.get("ib_write_bw_missing")]
        series = {name: {"harness": [(p["bytes"], p["gbps"]) for p in e["harness"]],
                         "ib_write_bw": [(p["bytes"], p["gbps"]) for p in e["ib_write_bw"]]}
                  for name, e in measured.items()}
        png = out / "bandwidth.png"
        png.unlink(missing_ok=True)
        if plot_bandwidth(series, png):
            report["bandwidth_png"] = True
        else:
            notes.append("matplotlib is not installed (pip install 'pytest-san[nightly]'): bandwidth.png not "
                         "drawn; the numbers are below and in report.json.")
        report["bandwidth_note"] = " ".join(notes) or None

    report["rules"] = [r for r in RULE_IDS if any(r in e["rules"] for e in report["hosts"].values())]
    report["status"] = "failed" if failed else "passed"
    report["started"], report["finished"] = started, now_iso()
    report["duration"] = round(time.monotonic() - began, 3)
    merge_junit(suites + models, out / "junit.xml")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")  # ASCII (\\u escapes)
    (out / "summary.md").write_text(render_summary(report), encoding="utf-8")
    write_index(report, out)
    written = ["index.html", "junit.xml", "report.json", "summary.md"] + (["bandwidth.png"] if report["bandwidth_png"]
                                                                           else [])
    if report["model"]:
        m = report["model"]
        say(f"nightly: model: {m['status']}: {m['sequences']} sequences, {m['steps']} steps, "
            f"{m['divergences']} divergence(s) (summary.md says where and how to replay)")
    say(f"nightly: {report['status']}: wrote {', '.join(str(out / name) for name in written)}")
    return 1 if failed else 0


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


__all__ = ["HostSet", "ModelOptions", "NightlyOptions", "add_nightly_command", "host_sets", "merge_junit",
           "nightly", "print_safely", "render_summary", "set_report"]
