"""``san-hil nightly``: the conformance suite on every host (pair) of an inventory, for CI.

One pytest subprocess per host set (a self-sufficient host alone, verbs hosts in pairs), each running
the whole suite on its set with ``--san-hosts``: that gives conformance per host, which one pytest
``-n`` run (tests spread over the hosts) would not. Sets run in parallel up to ``--jobs``; two sets
sharing a host (the odd verbs host out is paired with its predecessor) never run at once, and the
hosts' leases keep other runs off them. Then, on verbs pairs, RDMA write bandwidth (harness and
ib_write_bw). Writes into ``--out``: ``junit.xml`` (one testsuite per set), ``report.json``
(conformance per set and rule), ``summary.md`` (read in ten seconds) and ``bandwidth.png``.

The parts: :mod:`hil.tools.nightly_plan` (the host sets), :mod:`hil.tools.nightly_runs` (running
their pytest), :mod:`hil.tools.nightly_results` (junit.xml, report.json entries, summary.md); here the
bandwidth measurement and the command that ties them together.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hil.controller.leases import DEFAULT_LEASE_TIMEOUT, now_iso
from hil.inventory import load_inventory
from hil.tools.nightly_plan import HostSet, host_sets
from hil.tools.nightly_results import merge_junit, render_summary, set_report
from hil.tools.nightly_runs import SetRun, pytest_argv, run_sets
from pytest_san.report import RULE_IDS

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


def nightly(opts: NightlyOptions, say: Callable[[str], None] | None = None) -> int:
    """Run it all and write the four files; 0 only when every set passed and every measurement worked."""
    say = say or (lambda line: print(line, flush=True))
    inventory = opts.inventory.resolve()
    hosts = load_inventory(inventory).select(opts.group, opts.hosts)
    sets = host_sets(hosts)
    out = opts.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = [SetRun(hs, out / "hosts" / hs.slug) for hs in sets]
    for run in runs:
        run.argv = pytest_argv(run, inventory, opts.group, opts.lease_timeout, opts.pytest_args)
        for stale in (run.junit, run.report, run.failures):
            stale.unlink(missing_ok=True)
    started, began = now_iso(), time.monotonic()
    jobs = max(1, opts.jobs or len(runs))
    say(f"nightly: {len(runs)} host set(s) from {inventory} group {opts.group}: "
        f"{', '.join(r.set.name for r in runs)}; {jobs} at a time")
    run_sets(runs, jobs, say)

    report: dict[str, Any] = {
        "inventory": str(inventory), "group": opts.group, "pytest_args": list(opts.pytest_args),
        "hosts": {run.set.name: set_report(run) for run in runs},
    }
    failed = any(entry["status"] != "passed" for entry in report["hosts"].values())

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
    merge_junit(runs, out / "junit.xml")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(render_summary(report), encoding="utf-8")
    written = ["junit.xml", "report.json", "summary.md"] + (["bandwidth.png"] if report["bandwidth_png"] else [])
    say(f"nightly: {report['status']}: wrote {', '.join(str(out / name) for name in written)}")
    return 1 if failed else 0


def add_nightly_command(commands: Any) -> None:
    """``san-hil nightly`` on ``san-hil``'s subparsers."""
    p = commands.add_parser(
        "nightly", allow_abbrev=False,
        usage="san-hil nightly --inventory PATH --out DIR [options] [--] [pytest args ...]",
        help="the suite on every host (pair) of the inventory, in parallel; junit.xml, report.json, "
             "summary.md, bandwidth.png in --out (extra arguments go to pytest)")
    p.add_argument("--inventory", required=True, type=Path, help="lab inventory (Ansible-style YAML)")
    p.add_argument("--out", required=True, type=Path, help="directory for the results")
    p.add_argument("--group", default="san", help="inventory group (default: san)")
    p.add_argument("--limit", dest="hosts", default=None, metavar="NAMES", help="comma-separated host names to use")
    p.add_argument("--jobs", type=int, default=None, help="host sets run at once (default: all)")
    p.add_argument("--lease-timeout", type=float, default=DEFAULT_LEASE_TIMEOUT,
                   help=f"wait this long for hosts leased by other runs (default {DEFAULT_LEASE_TIMEOUT:g} s)")
    p.add_argument("--no-bandwidth", dest="bandwidth", action="store_false",
                   help="skip the RDMA bandwidth measurement on verbs hosts")
    p.set_defaults(run=_run, accepts_extra_args=True)


def _run(args: Any) -> int:
    extra = list(getattr(args, "extra_args", []))
    while extra[:1] == ["--"]:
        extra = extra[1:]
    if args.jobs is not None and args.jobs < 1:
        print("san-hil nightly: --jobs must be at least 1", file=sys.stderr)
        return 2
    try:
        opts = NightlyOptions(inventory=args.inventory, out=args.out, group=args.group,
                              hosts=args.hosts.split(",") if args.hosts else None, jobs=args.jobs,
                              lease_timeout=args.lease_timeout, bandwidth=args.bandwidth, pytest_args=extra)
        return nightly(opts)
    except ValueError as exc:  # InventoryError included
        print(f"san-hil nightly: {exc}", file=sys.stderr)
        return 2


__all__ = ["HostSet", "NightlyOptions", "add_nightly_command", "host_sets", "merge_junit", "nightly",
           "render_summary", "set_report"]
