"""CONTRACT.md's table "The reference order of checks", rendered from ``pytest_san.spi.checks.CHECKS``.

Documentation, not a check: it lives beside ``checks`` rather than in it, so that what the conformance run
judges (and mutation testing mutates) is the checks alone. tests/pytest_san/test_contract_doc.py keeps
CONTRACT.md's table equal to ``markdown_table()``; to update the contract after a change to ``CHECKS``, paste
``print("\\n".join(markdown_table()))``'s output over the old table.
"""

from __future__ import annotations

from .spi.checks import CALLS, CHECKS

_RDMA_CALLS = "`rdma_write`, `rdma_read`, `rdma_write_burst`, `rdma_read_burst`"


def markdown_table() -> list[str]:
    """CONTRACT.md's table of the order, one line per row."""
    lines = ["| # | check | the fault | answer | checked by |", "| --- | --- | --- | --- | --- |"]
    for i, c in enumerate(CHECKS, 1):
        calls = "every call" if c.calls == CALLS else ", ".join(f"`{call}`" for call in c.calls)
        calls = calls.replace(_RDMA_CALLS, "`rdma_write`, `rdma_read` and their bursts")
        shown = c.answer if c.at_call else f"an error completion, {c.answer}"
        lines.append(f"| {i} | `{c.id}` | {c.fault} | {shown} | {calls} |")
    return lines
