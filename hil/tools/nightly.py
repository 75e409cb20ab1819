"""``san-hil nightly``: the conformance suite on every host (pair) of an inventory, for CI.

One pytest subprocess per host set (a self-sufficient host alone, verbs hosts in pairs), each running
the whole suite on its set with ``--san-hosts``: that gives conformance per host, which one pytest
``-n`` run (tests spread over the hosts) would not. Sets run in parallel up to ``--jobs``; two sets
sharing a host (the odd verbs host out is paired with its predecessor) never run at once, and the
hosts' leases keep other runs off them. Then, on verbs pairs, RDMA write bandwidth (harness and
ib_write_bw). Writes into ``--out``: ``junit.xml`` (one testsuite per set), ``report.json``
(conformance per set and rule), ``summary.md`` (read in ten seconds) and ``bandwidth.png``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hil.controller.leases import DEFAULT_LEASE_TIMEOUT, now_iso, self_sufficient
from hil.inventory import HostConfig, load_inventory
from pytest_san.report import RULE_IDS

SUITE = "pytest_san.scenarios"
PASS, FAIL, NONE = "\u2713", "\u2717", "\u2013"  # check mark, ballot x, en dash
_DIAGNOSTIC_LINES = 40


@dataclass(frozen=True)
class HostSet:
    """What one pytest run of the nightly uses: one self-sufficient host, or a pair of verbs hosts."""

    hosts: tuple[HostConfig, ...]

    @property
    def name(self) -> str:
        return "+".join(h.name for h in self.hosts)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def verbs(self) -> bool:
        return any(h.engine == "verbs" for h in self.hosts)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._+-]", "_", self.name)


def host_sets(hosts: Sequence[HostConfig]) -> list[HostSet]:
    """Self-sufficient hosts (emulator engine, san_loopback) alone; the other hosts in pairs, in order.

    An odd host out is paired with the host before it, so every host is tested; the two sets share a
    host and are run one after the other.
    """
    sets: list[HostSet] = []
    unpaired: list[HostConfig] = []
    last_pair: HostSet | None = None
    for host in hosts:
        if self_sufficient(host):
            sets.append(HostSet((host,)))
            continue
        unpaired.append(host)
        if len(unpaired) == 2:
            last_pair = HostSet((unpaired[0], unpaired[1]))
            sets.append(last_pair)
            unpaired = []
    if unpaired:
        partner = last_pair.hosts[-1] if last_pair is not None else None
        if partner is None:
            raise ValueError(f"host {unpaired[0].name} (engine {unpaired[0].engine}) needs a partner: a verbs host "
                             "that is not san_loopback runs in a pair, and the selection has no other")
        sets.append(HostSet((partner, unpaired[0])))
    return sets


# --- running the sets ---------------------------------------------------------------------------------


@dataclass
class SetRun:
    """One set's pytest run: where its files go, and how it ended."""

    set: HostSet
    directory: Path
    argv: list[str] = field(default_factory=list)
    exit_status: int | None = None
    started: float = 0.0
    duration: float = 0.0

    @property
    def junit(self) -> Path:
        return self.directory / "junit.xml"

    @property
    def report(self) -> Path:
        return self.directory / "report.json"

    @property
    def failures(self) -> Path:
        return self.directory / "failures.json"

    @property
    def log(self) -> Path:
        return self.directory / "pytest.log"


def pytest_argv(run: SetRun, inventory: Path, group: str, lease_timeout: float, extra: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "--pyargs", SUITE, "--san-backend=hil",
            f"--san-inventory={inventory}", f"--san-group={group}", f"--san-hosts={','.join(run.set.names)}",
            f"--san-hosts-per-worker={len(run.set.hosts)}", f"--san-lease-timeout={lease_timeout:g}",
            f"--san-report={run.report}", f"--junitxml={run.junit}", "-o", f"junit_suite_name={run.set.name}",
            "-o", f"cache_dir={run.directory / '.pytest_cache'}",
            "-p", "hil.plugin.nightly", f"--san-failures={run.failures}", *extra]


def run_sets(runs: Sequence[SetRun], jobs: int, say: Callable[[str], None],
             poll: float = 0.2) -> None:
    """Run every set's pytest, ``jobs`` at a time, never two sets that share a host at once."""
    pending = list(runs)
    running: dict[int, tuple[SetRun, subprocess.Popen[bytes]]] = {}
    try:
        while pending or running:
            in_use = {name for run, _ in running.values() for name in run.set.names}
            for run in list(pending):
                if len(running) >= jobs:
                    break
                if in_use.isdisjoint(run.set.names):
                    run.directory.mkdir(parents=True, exist_ok=True)
                    with run.log.open("wb") as log:
                        proc = subprocess.Popen(run.argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL)
                    run.started = time.monotonic()
                    running[proc.pid] = (run, proc)
                    pending.remove(run)
                    in_use.update(run.set.names)
                    say(f"nightly: {run.set.name}: running pytest (log: {run.log})")
            for pid, (run, proc) in list(running.items()):
                status = proc.poll()
                if status is not None:
                    run.exit_status = status
                    run.duration = time.monotonic() - run.started
                    del running[pid]
                    say(f"nightly: {run.set.name}: {_outcome_line(run)}")
            if pending or running:
                time.sleep(poll)
    except BaseException:
        for _, proc in running.values():
            proc.send_signal(signal.SIGINT)  # pytest ends its session (and the agents) cleanly
        for _, proc in running.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise


def _outcome_line(run: SetRun) -> str:
    report = _load_json(run.report)
    counts = _totals(report) if isinstance(report, dict) else None
    text = ", ".join(f"{n} {k}" for k, n in (counts or {}).items() if n) or "no SAN tests recorded"
    mark = PASS if run.exit_status == 0 else f"{FAIL} pytest exit {run.exit_status}:"
    return f"{mark} {text} in {run.duration:.1f} s"


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _totals(report: Mapping[str, Any]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for test in report.get("tests", ()):
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    return counts


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


# --- junit.xml ----------------------------------------------------------------------------------------


def merge_junit(runs: Sequence[SetRun], path: Path) -> None:
    """One <testsuite> per set, named by it; classnames prefixed with it so dashboards keep hosts apart."""
    root = ET.Element("testsuites", name="pytest-san nightly")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    seconds = 0.0
    for run in runs:
        suites = _read_suites(run)
        for suite in suites:
            suite.set("name", run.set.name)
            suite.set("hostname", ",".join(run.set.names))
            prefix = run.set.name.replace(".", "_")
            for case in suite.iter("testcase"):
                case.set("classname", f"{prefix}.{case.get('classname', '')}".rstrip("."))
            for key in totals:
                totals[key] += int(suite.get(key, "0") or 0)
            seconds += float(suite.get("time", "0") or 0)
            root.append(suite)
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{seconds:.3f}")
    ET.indent(root)
    path.write_bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n")


def _read_suites(run: SetRun) -> list[ET.Element]:
    try:
        tree = ET.parse(run.junit)
    except (OSError, ET.ParseError):
        tree = None
    suites = [] if tree is None else (
        [tree.getroot()] if tree.getroot().tag == "testsuite" else list(tree.getroot().iter("testsuite")))
    if suites and run.exit_status in (0, 1):
        return suites
    # pytest did not get to (or through) its tests: one error case, so the dashboard shows the set red.
    suite = suites[0] if suites else ET.Element("testsuite", name=run.set.name, tests="0", failures="0",
                                                errors="0", skipped="0", time=f"{run.duration:.3f}")
    case = ET.SubElement(suite, "testcase", classname="pytest", name="session")
    error = ET.SubElement(case, "error", message=f"pytest exited with status {run.exit_status}")
    error.text = _log_tail(run.log)
    suite.set("tests", str(int(suite.get("tests", "0")) + 1))
    suite.set("errors", str(int(suite.get("errors", "0")) + 1))
    return [suite]


# --- report.json --------------------------------------------------------------------------------------


def set_report(run: SetRun) -> dict[str, Any]:
    """One set's entry of report.json: status, per-rule counts, its failures with diagnostics, leases."""
    report = _load_json(run.report)
    report = report if isinstance(report, dict) else {}
    failures = _load_json(run.failures)
    diagnostics: dict[str, dict[str, str]] = {}
    for failure in failures if isinstance(failures, list) else []:
        diagnostics.setdefault(failure["nodeid"], {}).update(failure.get("diagnostics", {}))
    rules: dict[str, dict[str, Any]] = {}
    for rule, counts in (report.get("rules") or {}).items():
        if any(counts.values()):
            status = "failed" if counts["failed"] else "passed" if counts["passed"] else "skipped"
            rules[rule] = {**counts, "status": status}
    failed_tests = [{"nodeid": t["nodeid"], "rules": t["rules"], "reason": t["reason"],
                     "diagnostics": diagnostics.get(t["nodeid"], {})}
                    for t in report.get("tests", ()) if t["outcome"] == "failed"]
    recorded = {t["nodeid"] for t in failed_tests}
    # Failures outside SAN tests (a plain test, a collection error) still count and still show.
    others: dict[str, dict[str, Any]] = {}
    for failure in failures if isinstance(failures, list) else []:
        if failure["nodeid"] not in recorded:
            others.setdefault(failure["nodeid"], {"nodeid": failure["nodeid"], "rules": [],
                                                  "reason": failure.get("message", ""), "diagnostics": {}})
            others[failure["nodeid"]]["diagnostics"].update(failure.get("diagnostics", {}))
    ok = run.exit_status == 0
    return {
        "hosts": run.set.names,
        "engines": sorted({h.engine for h in run.set.hosts}),
        "status": "passed" if ok else "failed",
        "exit_status": run.exit_status,
        "duration": round(run.duration, 3),
        "capabilities": report.get("capabilities", []),
        "totals": _totals(report),
        "rules": rules,
        "failures": failed_tests + list(others.values()),
        "leases": report.get("leases", []),
        "log": str(run.log),
        "error": None if ok or report else _log_tail(run.log, 15),
    }


# --- summary.md ---------------------------------------------------------------------------------------


def _cell(counts: Mapping[str, Any] | None) -> str:
    if not counts:
        return NONE
    ran = int(counts["passed"]) + int(counts["failed"])
    if counts["failed"]:
        return f"{FAIL} {counts['failed']}/{ran}"
    return f"{PASS} {counts['passed']}" if counts["passed"] else NONE


def _fence(text: str) -> str:
    lines = text.rstrip().splitlines()
    if len(lines) > _DIAGNOSTIC_LINES:
        lines = [*lines[:_DIAGNOSTIC_LINES], f"... ({len(lines) - _DIAGNOSTIC_LINES} more lines in the pytest log)"]
    body = "\n".join(lines)
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", body)), default=0))
    return f"{fence}text\n{body}\n{fence}"


def render_summary(report: Mapping[str, Any]) -> str:
    sets: Mapping[str, Mapping[str, Any]] = report["hosts"]
    ok = report["status"] == "passed"
    rules = [r for r in RULE_IDS if any(r in s["rules"] for s in sets.values())]
    lines = [f"# pytest-san nightly: {PASS + ' passed' if ok else FAIL + ' FAILED'}", ""]
    args = f" · pytest args `{shlex.join(report['pytest_args'])}`" if report["pytest_args"] else ""
    lines.append(f"{_when(report['started'])} ({report['duration']:.0f} s) · inventory `{report['inventory']}` · "
                 f"group `{report['group']}` · {len(sets)} host set(s){args}")
    lines += ["", "| host | result | tests | " + " | ".join(rules) + " |",
              "| --- | --- | --- | " + " | ".join(":-:" for _ in rules) + " |"]
    for name, entry in sets.items():
        t = entry["totals"]
        result = f"{PASS} passed" if entry["status"] == "passed" else f"{FAIL} failed (exit {entry['exit_status']})"
        tests = f"{t['passed']} {PASS} · {t['failed']} {FAIL} · {t['skipped']} {NONE}"
        cells = [_cell(entry["rules"].get(rule)) for rule in rules]
        lines.append(f"| **{name}** | {result} | {tests} | " + " | ".join(cells) + " |")
    lines += ["", f"{PASS} n: every test of the rule passed (n tests) · {FAIL} f/n: f of the n tests that ran "
                  f"failed · {NONE}: not run on that host (skipped: capability missing). Per test: "
                  f"passed · failed · skipped.", ""]
    failing = [(name, entry) for name, entry in sets.items() if entry["status"] != "passed"]
    if failing:
        lines += ["## Failures", ""]
        for name, entry in failing:
            if not entry["failures"]:
                lines += [f"### {name}: pytest exited {entry['exit_status']} without a failed test", "",
                          _fence(entry.get("error") or f"see {entry['log']}"), ""]
            for failure in entry["failures"]:
                rules_text = f" ({', '.join(failure['rules'])})" if failure["rules"] else ""
                reason = failure["reason"] or "(no message)"
                lines += [f"### {name}: `{failure['nodeid']}`{rules_text}", "", f"> {reason}", ""]
                for host, text in failure["diagnostics"].items():
                    lines += [f"<details><summary>host diagnostics: {host}</summary>", "", _fence(text), "",
                              "</details>", ""]
            lines += [f"Full output: `{entry['log']}`", ""]
    lines += ["## RDMA write bandwidth", ""]
    bandwidth = report.get("bandwidth")
    if not bandwidth:
        lines.append(report.get("bandwidth_note") or "No verbs hosts in the inventory: no RDMA bandwidth measured, "
                                                     "bandwidth.png not written.")
    else:
        if report.get("bandwidth_png"):
            lines += ["![RDMA write bandwidth: harness and ib_write_bw](bandwidth.png)", ""]
        if report.get("bandwidth_note"):
            lines += [report["bandwidth_note"], ""]
        for name, entry in bandwidth.items():
            lines += [f"**{name}** (Gb/s)", "", "| bytes | harness | ib_write_bw |", "| ---: | ---: | ---: |"]
            harness = {p["bytes"]: p["gbps"] for p in entry.get("harness", [])}
            perftest = {p["bytes"]: p["gbps"] for p in entry.get("ib_write_bw", [])}
            for size in sorted(set(harness) | {s for s in perftest if s >= min(harness, default=0)}):
                lines.append(f"| {size} | {_gbps(harness.get(size))} | {_gbps(perftest.get(size))} |")
            for key in ("harness_error", "ib_write_bw_error"):
                if entry.get(key):
                    lines += ["", f"{FAIL} {key.replace('_error', '')}: {entry[key]}"]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _when(iso: str) -> str:
    """'2026-11-29T21:22:49.057+00:00' -> '2026-11-29 21:22:49 +00:00'."""
    return f"{iso[:19].replace('T', ' ')} {iso[23:]}".rstrip()


def _gbps(value: float | None) -> str:
    return NONE if value is None else f"{value:.3g}"


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
    p.add_argument("--hosts", default=None, help="comma-separated subset of the group's hosts")
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
