"""What ``san-hil nightly`` makes of its runs: the merged junit.xml, report.json entries and summary.md.

``merge_junit`` writes one <testsuite> per run (a set's suite, its model); ``set_report`` is one set's
suite entry of report.json (status, per-rule counts, failures with host diagnostics, leases);
``render_summary`` is summary.md (the verdict, a table of sets by rules, the model's results, the suite's
failures, the RDMA write bandwidth), read in ten seconds. summary.md is UTF-8 (its marks are not ASCII).
"""

from __future__ import annotations

import re
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hil.nightly.model import render_model
from hil.nightly.runs import DEVIATING, FAIL, NONE, PASS, SetRun, _load_json, _totals
from pytest_san.report import RULE_IDS

__all__ = ["merge_junit", "render_summary", "set_report", "verdict_parts"]

_DIAGNOSTIC_LINES = 40


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


# --- junit.xml ----------------------------------------------------------------------------------------


def merge_junit(runs: Sequence[SetRun], path: Path) -> None:
    """One <testsuite> per run, named by its set (and "model"); classnames prefixed with that name so
    dashboards keep hosts apart."""
    root = ET.Element("testsuites", name="pytest-san nightly")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    seconds = 0.0
    for run in runs:
        suites = _read_suites(run)
        for suite in suites:
            suite.set("name", run.label)
            suite.set("hostname", ",".join(run.set.names))
            prefix = re.sub(r"[. ]", "_", run.label)
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
    suite = suites[0] if suites else ET.Element("testsuite", name=run.label, tests="0", failures="0",
                                                errors="0", skipped="0", time=f"{run.duration:.3f}")
    case = ET.SubElement(suite, "testcase", classname="pytest", name="session")
    error = ET.SubElement(case, "error", message=f"pytest exited with status {run.exit_status}")
    error.text = _log_tail(run.log)
    suite.set("tests", str(int(suite.get("tests", "0")) + 1))
    suite.set("errors", str(int(suite.get("errors", "0")) + 1))
    return [suite]


# --- report.json --------------------------------------------------------------------------------------


def _kernel_findings(resources: Mapping[str, Any]) -> dict[str, Any]:
    """How many hosts' kernels were read, and what they found (each finding also failed its test)."""
    read = [entry for entry in resources.values() if not entry.get("unavailable")]
    findings = sum(len(test.get("findings", ())) for entry in read for test in entry.get("tests", ()))
    findings += sum(len((entry.get("session_end") or {}).get("findings", ())) for entry in read)
    workarounds = sorted({w for entry in resources.values() for w in entry.get("workarounds") or ()})
    return {"kernel_read": len(read), "kernel_findings": findings, "workarounds": workarounds}


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
        "kernel": report.get("kernel", {}),  # host -> its kernel release, as its agent saw it
        **_kernel_findings(report.get("kernel_resources") or {}),
        "log": str(run.log),
        "html": str(run.html) if run.html.is_file() else None,
        "error": None if ok or report else _log_tail(run.log, 15),
    }


# --- summary.md ---------------------------------------------------------------------------------------


def _cell(counts: Mapping[str, Any] | None) -> str:
    if not counts:
        return NONE
    deviating = int(counts.get("deviating", 0))
    ran = int(counts["passed"]) + int(counts["failed"]) + deviating
    if counts["failed"]:
        return f"{FAIL} {counts['failed']}/{ran}"
    if deviating:
        return f"{DEVIATING} {deviating}/{ran}"
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
    lines += ["", _verdict(report)]
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
    kernels = [f"{host} `{release}`" for entry in sets.values() for host, release in entry.get("kernel", {}).items()]
    if kernels:
        findings = sum(entry.get("kernel_findings", 0) for entry in sets.values())
        read = sum(entry.get("kernel_read", 0) for entry in sets.values())
        witness = (f"{FAIL} {findings} finding(s) (the tests that left them failed)" if findings else
                   f"{PASS} nothing left by the agents' processes, on {read} host(s)" if read else
                   "not read (no verbs host)")
        lines += [f"Kernels: {', '.join(kernels)}; the kernel's RDMA resource tracking: {witness}", ""]
    lines += render_model(report)
    failing = [(name, entry) for name, entry in sets.items() if entry["status"] != "passed"]
    if failing:
        lines += ["## Suite failures", ""]
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
            lines += [f"**{name}** (Gb/s)", "", "| bytes | harness | ib_write_bw | harness / ib_write_bw |",
                      "| ---: | ---: | ---: | ---: |"]
            harness = {p["bytes"]: p["gbps"] for p in entry.get("harness", [])}
            perftest = {p["bytes"]: p["gbps"] for p in entry.get("ib_write_bw", [])}
            for size in sorted(set(harness) | {s for s in perftest if s >= min(harness, default=0)}):
                ratio = harness[size] / perftest[size] if harness.get(size) and perftest.get(size) else None
                lines.append(f"| {size} | {_gbps(harness.get(size))} | {_gbps(perftest.get(size))} | "
                             f"{_gbps(ratio)} |")
            for key in ("harness_error", "ib_write_bw_error"):
                if entry.get(key):
                    lines += ["", f"{FAIL} {key.replace('_error', '')}: {entry[key]}"]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def verdict_parts(report: Mapping[str, Any]) -> list[tuple[str, bool | None, str]]:
    """(what, passed or None when not run, the verdict) of the suite, the model and, if it failed, bandwidth:
    summary.md's and index.html's verdict line."""
    sets = report["hosts"].values()
    failed = sum(1 for entry in sets if entry["status"] != "passed")
    parts: list[tuple[str, bool | None, str]] = [
        ("Suite", True, f"{PASS} passed on all {len(sets)} host set(s)") if not failed else
        ("Suite", False, f"{FAIL} failed on {failed} of {len(sets)} host set(s)")]
    model = report.get("model")
    if not model:
        parts.append(("Model", None, "not run (--no-model)"))
    elif model["status"] == "passed":
        parts.append(("Model", True, f"{PASS} no divergence in {model['sequences']} sequences, {model['steps']} steps"))
    else:
        broken = sum(1 for e in model["sets"].values() if e["status"] == "failed")
        text = f"{FAIL} {model['divergences']} divergence(s) in {model['sequences']} sequences"
        parts.append(("Model", False, text + (f", the run failed on {broken} host set(s)" if broken else "")))
    bandwidth = report.get("bandwidth") or {}
    if any(e.get("harness_error") or e.get("ib_write_bw_error") for e in bandwidth.values()):
        parts.append(("Bandwidth", False, f"{FAIL} a measurement failed"))
    return parts


def _verdict(report: Mapping[str, Any]) -> str:
    """One line: the suite's and the model's verdicts, and bandwidth's if it failed."""
    return " · ".join(f"**{what}**: {text}" for what, _, text in verdict_parts(report))


def _when(iso: str) -> str:
    """'2026-11-29T21:22:49.057+00:00' -> '2026-11-29 21:22:49 +00:00'."""
    return f"{iso[:19].replace('T', ' ')} {iso[23:]}".rstrip()


def _gbps(value: float | None) -> str:
    return NONE if value is None else f"{value:.3g}"
