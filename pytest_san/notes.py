"""Notes on an exception already being raised: what else failed while it was handled."""

from __future__ import annotations


def add_note(failure: BaseException, note: str) -> None:
    """``failure.add_note(note)`` where Python has it (3.11+)."""
    add = getattr(failure, "add_note", None)
    if add is not None:
        add(note)
