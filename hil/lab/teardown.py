"""``lab down``: stop every process of the lab and remove every file it made (also after a failed ``up``).

The teardown holds off Ctrl-C and SIGTERM while it runs, stops only process groups that still run this
lab's processes, and fails if any of them is left.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from hil.lab import LabError
from hil.lab.procs import group_is_ours, group_members, stop_group, temp_files
from hil.lab.procs import leftovers as _leftovers
from hil.lab.progress import Progress
from hil.lab.state import DEFAULT_STATE_DIR, STATE_FILE, LabState

__all__ = ["down", "leftovers"]


def leftovers(state: LabState) -> list[str]:
    """Processes of this lab still running (naming its state directory), as ``pid (command)``."""
    return _leftovers(state.state_dir)


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Hold off Ctrl-C and SIGTERM while tearing down: a second Ctrl-C must not leave half a lab behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _teardown(state: LabState, progress: Callable[[str, str], None]) -> None:
    with _uninterrupted():
        _stop_and_remove(state, progress)


def _stop_and_remove(state: LabState, progress: Callable[[str, str], None]) -> None:
    named = [(g.name, g.pgid) for g in state.guests] + [("hub", state.hub_pgid)]
    for name, pgid in named:
        if pgid is None or not group_members(pgid):
            continue
        if not group_is_ours(pgid, state.state_dir):
            progress(name, f"process group {pgid} no longer runs this lab's processes; left alone")
            continue
        for path in temp_files(pgid):
            state.add_file(path)
        survivors = stop_group(pgid)
        progress(name, f"stopped (process group {pgid})" if not survivors else f"still running: {survivors}")
    removed = 0
    for path in [*state.files, str(state.path)]:
        try:
            Path(path).unlink()
            removed += 1
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            shutil.rmtree(path, ignore_errors=True)
    state.path.with_suffix(".tmp").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        Path(state.state_dir).rmdir()  # only if empty: whatever else someone keeps there stays
    progress("host", f"removed {removed} files")
    left = leftovers(state)
    if left:
        raise LabError("processes of the lab are still running: " + "; ".join(left))


def down(state_dir: Path = DEFAULT_STATE_DIR, progress: Progress | None = None) -> int:
    """Stop every process of the lab and remove its files; 0 also when there was no lab (it says so)."""
    progress = progress or Progress()
    directory = state_dir.expanduser().absolute()
    state = LabState.load(directory)
    if state is None:
        progress("host", f"no lab in {directory} (no {STATE_FILE}): nothing to stop")
        return 0
    _teardown(state, progress)
    progress("host", "lab down; no lab process is left")
    return 0
