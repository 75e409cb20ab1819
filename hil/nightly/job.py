"""``san-hil nightly``'s job: the conformance suite and the reference model on every host (pair) of an inventory.

Per host set (a self-sufficient host alone, verbs hosts in pairs) one pytest subprocess runs the whole
suite on the set with ``--san-hosts`` (conformance per host, which one pytest ``-n`` run spreading
tests over the hosts would not give), then another runs ``pytest_san.model`` there with nightly's larger
budget. Runs go in parallel up to ``--jobs``; two runs sharing a host (a set's suite and model, or the
odd verbs host out paired with its predecessor) never run at once, and the hosts' leases keep other
runs off them. Then, on verbs pairs, RDMA write bandwidth (harness and ib_write_bw). Writes into
``--out``: ``index.html`` (the whole night on one page, :mod:`hil.nightly.index`), ``junit.xml`` (one
testsuite per run), ``report.json`` (conformance per set and rule, the model per set), ``summary.md`` (read in
ten seconds) and ``bandwidth.png``; each run's pytest-html report where pytest-html is installed.

The parts: :mod:`hil.nightly.plan` (the host sets), :mod:`hil.nightly.runs` (running
their pytest), :mod:`hil.nightly.results` (junit.xml, report.json entries, summary.md),
:mod:`hil.nightly.model` (the model's budget, arguments and results); here the bandwidth
measurement across each verbs set (:mod:`hil.measure.bandwidth`) and the job that ties them together; its
command line is :mod:`hil.cli.nightly`. Every file is written as UTF-8 (or ASCII), and every terminal line
survives an ASCII locale (issue 12: a check mark once crashed nightly before it wrote its results).

Progress (each run started and finished, the model's verdict, the files written) is logged as INFO records
of this module's logger, ``hil.nightly.job``, so pytest's ``log_cli`` and ``--log-file`` or any handler
see it; ``san-hil`` shows them on stderr through the handler its entry point adds (:mod:`hil.cli.console`,
on streams that escape what the locale cannot show). Its lines are ASCII in any case ("ok"/"FAILED").
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hil.controller.leases import DEFAULT_LEASE_TIMEOUT, now_iso
from hil.inventory import load_inventory
from hil.nightly.index import write_index
from hil.nightly.model import ModelOptions, model_args, model_report, plugin_args
from hil.nightly.plan import HostSet, host_sets
from hil.nightly.results import merge_junit, render_summary, set_report
from hil.nightly.runs import SetRun, pytest_argv, run_sets
from pytest_san.report import RULE_IDS

__all__ = ["NightlyOptions", "measure_bandwidth", "nightly", "out_directory"]

log = logging.getLogger(__name__)


def _progress(line: str) -> None:
    """One progress line, as a record of nightly's logger (the handler decides where it shows)."""
    log.info("%s", line)


# --- bandwidth ----------------------------------------------------------------------------------------


def measure_bandwidth(hs: HostSet, lease_timeout: float, say: Callable[[str], None]) -> dict[str, Any]:
    """Harness and ib_write_bw across a verbs set (a loopback host: to itself), with the set leased."""
    from hil.controller.backend import HilBackend
    from hil.controller.leases import LeasePolicy, LeaseRequest
    from hil.measure.bandwidth import has_ib_write_bw, measure_harness, measure_ib_write_bw

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


# --- the job ------------------------------------------------------------------------------------------


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
    and every measurement worked. Progress: records of ``hil.nightly.job``."""
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
        from hil.measure.bandwidth import plot_bandwidth

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
