"""Host diagnostics attached to a failed test: RDMA links, device attributes, the kernel log."""

from __future__ import annotations

from collections.abc import Iterable

from hil.transport import Transport, TransportError

DIAGNOSTICS_PREFIX = "san host diagnostics: "
"""A failed test's report section per host: this prefix, then its name (``nightly`` reads them)."""

COMMANDS: tuple[tuple[str, list[str]], ...] = (
    ("rdma link", ["rdma", "link", "show"]),
    ("device attributes", ["ibv_devinfo", "-v"]),
    ("kernel log (tail)", ["sh", "-c", "dmesg 2>&1 | tail -n 40"]),
)


def collect(name: str, transport: Transport, timeout: float = 10.0,
            commands: Iterable[tuple[str, list[str]]] = COMMANDS) -> str:
    """One text block per command; a command that fails says how, it never raises."""
    parts = [f"== host {name}"]
    for title, argv in commands:
        try:
            result = transport.run(argv, timeout=timeout)
            body = (result.stdout or "").rstrip() or "(no output)"
            if result.returncode:
                body += f"\n(exit {result.returncode}) {(result.stderr or '').strip()[-400:]}"
        except TransportError as exc:
            body = f"(could not run: {exc})"
        parts.append(f"-- {title}: {' '.join(argv)}\n{body[-4000:]}")
    return "\n".join(parts)
