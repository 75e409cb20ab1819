"""What differs per kernel and provider, from a night's labs (``san-hil matrix DIR``, :mod:`hil.cli.matrix`).

``.ci/nightly`` runs ``san-hil nightly`` on a lab of every kernel x provider and leaves each one's results in
``DIR/<provider>-<kernel>/`` (``report.json``). This reads them all and writes ``DIR/matrix.md`` and
``DIR/matrix.json``: per lab the kernel release its guests ran, the suite's outcome (tests, the rules that
failed, the tests skipped for a capability), what the kernel's own RDMA resource tracking found, the
reference model (sequences, divergences, the documented alternatives it expected and how often), the
engine's kernel workarounds applied, and RDMA write bandwidth at 64 KiB against ``ib_write_bw``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_san.report import load_report

__all__ = ["cell", "cells", "render", "write_matrix"]

SIZE = 65536  # the bandwidth compared: 64 KiB writes, as benchmarks/lab.py's goal



def _at(points: Sequence[Mapping[str, Any]], size: int) -> float | None:
    return next((float(p["gbps"]) for p in points if int(p.get("bytes", 0)) == size), None)


def cell(folder: Path) -> dict[str, Any]:
    """One lab's row: ``folder`` is ``<provider>-<kernel>`` holding san-hil nightly's report.json."""
    provider, _, kernel = folder.name.partition("-")
    report = load_report(folder / "report.json")
    sets: Mapping[str, Mapping[str, Any]] = report.get("hosts") or {}
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    failed_rules: set[str] = set()
    releases: set[str] = set()
    findings, workarounds = 0, set()
    for entry in sets.values():
        for key in totals:
            totals[key] += int((entry.get("totals") or {}).get(key, 0))
        failed_rules |= {rule for rule, counts in (entry.get("rules") or {}).items() if counts.get("failed")}
        releases |= set((entry.get("kernel") or {}).values())
        findings += int(entry.get("kernel_findings", 0))
        workarounds |= set(entry.get("workarounds") or ())
    model = report.get("model") or {}
    alternatives: dict[str, int] = {}
    for entry in (model.get("sets") or {}).values():
        for name, count in (entry.get("alternatives") or {}).items():
            alternatives[name] = alternatives.get(name, 0) + int(count)
    bandwidth = [e for e in (report.get("bandwidth") or {}).values()]
    harness = next((v for e in bandwidth if (v := _at(e.get("harness", ()), SIZE)) is not None), None)
    perftest = next((v for e in bandwidth if (v := _at(e.get("ib_write_bw", ()), SIZE)) is not None), None)
    return {
        "lab": folder.name, "provider": provider, "kernel": kernel, "releases": sorted(releases),
        "status": report.get("status", "missing"), "tests": totals, "failed_rules": sorted(failed_rules, key=_rule),
        "kernel_findings": findings, "workarounds": sorted(workarounds),
        "model": {"status": model.get("status"), "sequences": model.get("sequences", 0),
                  "divergences": model.get("divergences", 0), "alternatives": dict(sorted(alternatives.items()))},
        "bandwidth_64k": {"harness_gbps": harness, "ib_write_bw_gbps": perftest,
                          "ratio": round(harness / perftest, 2) if harness and perftest else None},
    }


def _rule(rule: str) -> tuple[str, int]:
    match = re.match(r"([A-Z])(\d+)", rule)
    return (match.group(1), int(match.group(2))) if match else (rule, 0)


def cells(directory: Path) -> list[dict[str, Any]]:
    """Every lab under ``directory`` (a folder ``<provider>-<kernel>`` with a report.json), by kernel then provider."""
    found = [cell(p) for p in sorted(directory.iterdir()) if p.is_dir() and (p / "report.json").is_file()
             and "-" in p.name]
    return sorted(found, key=lambda c: (tuple(int(x) for x in re.findall(r"\d+", c["kernel"])), c["provider"]))


def _mbps(gbps: float | None) -> str:
    return "-" if gbps is None else f"{gbps * 1000 / 8:.1f}"


def render(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["# Kernels x providers", "",
             "| kernel | provider | release | suite | rules failed | kernel's record | model | alternatives in play "
             "(steps) | workarounds | 64 KiB writes, MB/s: harness / ib_write_bw |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        t, m, b = row["tests"], row["model"], row["bandwidth_64k"]
        suite = f"{row['status']}: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"
        model = (f"{m['sequences']} sequences, {m['divergences']} divergence(s)" if m["status"] else "not run")
        alternatives = ", ".join(f"`{name}` {count}" for name, count in m["alternatives"].items()) or "none"
        ratio = f" ({b['ratio']})" if b["ratio"] is not None else ""
        record = f"{row['kernel_findings']} finding(s)" if row["kernel_findings"] else "nothing left"
        lines.append(f"| {row['kernel']} | {row['provider']} | {', '.join(row['releases']) or '?'} | {suite} | "
                     f"{', '.join(row['failed_rules']) or 'none'} | {record} | {model} | {alternatives} | "
                     f"{', '.join(row['workarounds']) or 'none'} | "
                     f"{_mbps(b['harness_gbps'])} / {_mbps(b['ib_write_bw_gbps'])}{ratio} |")
    return "\n".join(lines) + "\n"


def write_matrix(directory: Path) -> list[dict[str, Any]]:
    rows = cells(directory)
    (directory / "matrix.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    (directory / "matrix.md").write_text(render(rows), encoding="utf-8")
    return rows
