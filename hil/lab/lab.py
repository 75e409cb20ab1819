"""The lab's commands: ``lab status``, ``lab ssh`` and ``lab run`` here; ``lab up`` and ``lab down`` re-exported.

``up`` (booting the guests) is in :mod:`hil.lab.boot`, ``down`` (the teardown) in
:mod:`hil.lab.teardown`, the progress lines in :mod:`hil.lab.progress`; ``run`` is up,
the conformance suite on the lab, then down, whatever happens.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from hil.lab import LabError
from hil.lab.boot import UpOptions, up
from hil.lab.keys import LabKeys
from hil.lab.procs import group_is_ours, group_members
from hil.lab.progress import Progress
from hil.lab.state import DEFAULT_STATE_DIR, LabState
from hil.lab.teardown import down, leftovers

__all__ = ["Progress", "Terminated", "UpOptions", "down", "handle_stop_signals", "leftovers", "pytest_command",
           "run", "ssh_command", "status", "stop_once", "up"]


def status(state_dir: Path = DEFAULT_STATE_DIR, out: TextIO | None = None) -> int:
    """What runs: 0 when a lab is up and every part of it is alive, 1 otherwise."""
    stream = out or sys.stdout
    directory = state_dir.expanduser().absolute()
    state = LabState.load(directory)
    if state is None:
        print(f"no lab in {directory}", file=stream)
        return 1
    age = time.time() - state.started
    kernel = f", kernel {state.kernel_release}" if state.kernel_release else ""  # a lab up'd before it was kept
    proxy = "" if state.proxy_module is None else f", {'san_proxy.ko' if state.proxy_module else 'proxy stand-in'}"
    low = "" if state.low_memory is None else f", low memory {state.low_memory}"
    print(f"lab in {directory}: {len(state.guests)} guests ({state.provider}{kernel}{proxy}{low}), started "
          f"{age:.0f} s ago, {'ready' if state.ready else 'NOT READY (booting, or up failed)'}", file=stream)
    healthy = state.ready
    hub_alive = state.hub_pgid is not None and group_is_ours(state.hub_pgid, state.state_dir)
    healthy &= hub_alive
    print(f"  hub   pid {state.hub_pgid}  127.0.0.1:{state.hub_port}  {'alive' if hub_alive else 'DEAD'}",
          file=stream)
    for g in state.guests:
        ours = g.pgid is not None and group_is_ours(g.pgid, state.state_dir)
        members = group_members(g.pgid) if ours and g.pgid is not None else []
        qemu = [pid for pid, comm in members if comm.startswith("qemu")]
        alive = bool(qemu)
        healthy &= alive
        print(f"  {g.name:5} vng pid {g.pgid} qemu pid {qemu[0] if qemu else '-'}  ssh 127.0.0.1:{g.ssh_port}  "
              f"{g.lab_address} on {g.netdev or '?'}  {g.accel}  {'alive' if alive else 'DEAD'}", file=stream)
    if state.inventory:
        print(f"  inventory: {state.inventory}", file=stream)
    return 0 if healthy else 1


def ssh_command(state_dir: Path, name: str, command: Sequence[str] = ()) -> list[str]:
    """The ``ssh`` command line that reaches guest ``name`` with the lab's own key and pinned host key."""
    directory = state_dir.expanduser().absolute()
    state = LabState.load(directory)
    if state is None:
        raise LabError(f"no lab in {directory} (san-hil lab up first)")
    guest = next((g for g in state.guests if g.name == name), None)
    if guest is None:
        names = ", ".join(g.name for g in state.guests) or "none"
        raise LabError(f"the lab in {directory} has no guest {name!r} (its guests: {names})")
    keys = LabKeys.in_dir(directory)
    return ["ssh", "-i", str(keys.client_key), "-o", f"UserKnownHostsFile={keys.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-p", str(guest.ssh_port), "root@127.0.0.1", *command]


# --- run -------------------------------------------------------------------------------------------


def pytest_command(inventory: Path, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "--pyargs", "pytest_san.scenarios", "--san-backend=hil",
            f"--san-inventory={inventory}", *args]


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C (every ``finally`` runs) but known to have reached only us."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_once(signum: int, frame: FrameType | None) -> None:
    """The first SIGINT or SIGTERM stops the command; later ones are ignored, so that a second signal
    cannot cut short the teardown the first one started (not even before it holds signals off)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(f"signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt


def handle_stop_signals() -> dict[int, Any]:
    """Install :func:`stop_once` for SIGINT and SIGTERM (main thread only); the handlers it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, stop_once) for sig in STOP_SIGNALS}


def _stop_pytest(proc: subprocess.Popen[bytes], forwarded: bool) -> None:
    # Ctrl-C on a terminal reaches pytest too: give it time to stop on its own (a second SIGINT would cut
    # its teardown short). SIGTERM reached only us: pass it on as the SIGINT pytest stops cleanly on.
    try:
        proc.wait(timeout=10 if forwarded else 0)
        return
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run(opts: UpOptions, pytest_args: Sequence[str], progress: Progress | None = None) -> int:
    """up, the conformance suite on the lab, down (whatever happens); pytest's exit status."""
    progress = progress or Progress()
    try:
        up(opts, progress)
        argv = pytest_command(opts.inventory, pytest_args)
        progress("host", "running " + " ".join(argv[1:]))
        # Started in the background by a shell, we inherit SIGINT ignored, and so would pytest: then it
        # could not be stopped the way it cleans up (SIGINT). A handler resets to default on exec.
        handle_stop_signals()
        proc = subprocess.Popen(argv)
        try:
            return proc.wait()
        except KeyboardInterrupt as exc:
            _stop_pytest(proc, forwarded=not isinstance(exc, Terminated))
            raise
    finally:
        down(opts.state_dir, progress)
