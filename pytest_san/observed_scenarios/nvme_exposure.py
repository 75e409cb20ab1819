"""``python -m pytest_san.observed_scenarios.nvme_exposure REPORT``: check that a run of the NVMe-oF observed
scenarios beside it (``test_nvme_rdma.py``) with ``--san-nvme-register-always=N`` still found the unsafe global rkey
(docs/nvme-rdma.md), so that the check cannot silently go blind.

The report (``--san-report`` JSON) must show the rogue target's two reads failing: past the advertised range under
R8 and R5, and with the old key after its command under R3 and R5, each reason naming the PD's unsafe global rkey
and the bytes read. Exit 0 when it does, else 1 naming what is missing (a scenario that passed, was skipped or
deviated, a reason without the key or the bytes).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["EXPECTED", "main", "missing"]

EXPECTED: Mapping[str, tuple[str, ...]] = {
    "test_a_peer_cannot_read_past_what_the_host_advertised": ("R5", "R8"),
    "test_a_key_is_dead_once_its_command_completed": ("R3", "R5"),
}
"""Each scenario that must fail with register_always=N, and the rules it must fail under."""


def missing(report: Mapping[str, Any]) -> list[str]:
    """What the report lacks of the exposure, in words (empty: all found)."""
    tests = {str(t.get("nodeid", "")).rsplit("::", 1)[-1]: t for t in report.get("tests", [])}
    problems = []
    for name, rules in EXPECTED.items():
        test = tests.get(name)
        if test is None:
            problems.append(f"{name} did not run")
            continue
        if test.get("outcome") != "failed":
            problems.append(f"{name} {test.get('outcome')}, it should fail: {str(test.get('reason'))[:200]}")
            continue
        if set(rules) - set(test.get("rules", [])):
            problems.append(f"{name} failed under {test.get('rules')}, not {', '.join(rules)}")
        reason = str(test.get("reason") or "")
        if "unsafe global rkey" not in reason:
            problems.append(f"{name}'s reason does not name the unsafe global rkey: {reason[:200]}")
        if "bytes read: (none)" in reason or "bytes read:" not in reason:
            problems.append(f"{name}'s reason shows no bytes read: {reason[:200]}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_san.observed_scenarios.nvme_exposure",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="the --san-report JSON of a run with register_always=N")
    args = parser.parse_args(argv)
    try:
        report = json.loads(args.report.read_text())
    except (OSError, ValueError) as exc:
        print(f"nvme_exposure: cannot read {args.report}: {exc}", file=sys.stderr)
        return 1
    problems = missing(report)
    for problem in problems:
        print(f"nvme_exposure: {problem}", file=sys.stderr)
    if not problems:
        print(f"nvme_exposure: the unsafe global rkey was found ({args.report}): "
              + "; ".join(f"{n} failed {', '.join(r)}" for n, r in EXPECTED.items()))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
