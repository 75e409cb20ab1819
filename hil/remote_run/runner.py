"""``san-hil run --on HOST``: the whole remote run, from the host's Python to the reports back.

1. ask the host's Python what it is (version, platform), over SSH;
2. build (or find cached) a wheelhouse for it here, push it, make or reuse its venv there;
3. push the local test files the arguments name, the rewritten inventory and the watchdog;
4. run the command under the watchdog, its output streamed live, a heartbeat on its stdin;
5. bring back the reports it wrote; the status is the command's.

Ctrl-C, a killed ``san-hil`` or a lost connection end the channel: the watchdog stops the command's process
group (INT, TERM, KILL), so its agents, and their leases, go with it, and removes the working directory.
"""

from __future__ import annotations

import base64
import json
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from hil.inventory import load_inventory
from hil.remote_run.arguments import INVENTORY_NAME, RunArguments, RunError, with_inventory
from hil.remote_run.lab_view import find_host, lab_view
from hil.remote_run.reports import bring_back
from hil.remote_run.venv import HOST_SCRIPTS, ensure_venv
from hil.remote_run.wheelhouse import PROBE, HostPython, build_wheelhouse
from hil.transport import Channel, Transport, TransportError, open_transport

__all__ = ["RunOutcome", "RunRequest", "run_remote"]

HEARTBEAT = 5.0  # seconds between the controller's heartbeats (the watchdog gives up after 6 missed)
STOP_GRACE = 15.0  # seconds the watchdog gets to stop the command (INT 4 s, TERM 2 s, KILL) once stdin ends
PROBE_TIMEOUT = 60.0
INTERRUPT = b"\x03"  # written to the watchdog's stdin: Ctrl-C (host/watchdog.py)
RECORD_SEPARATOR = "\x1e"  # starts the watchdog's status line: a byte pytest's output never holds


@dataclass(frozen=True)
class RunRequest:
    """A checked ``san-hil run``: the host's name, the inventory, the arguments as read, what else to install."""

    on: str
    inventory: Path
    arguments: RunArguments
    mutants: bool = False  # run `san-hil mutants` there instead of pytest
    requirements: tuple[str, ...] = ()  # more distributions for the host's venv (--with)
    color: bool = False  # the user's terminal shows colour: ask pytest for it
    cache: Path | None = None  # the wheelhouse cache (default: ~/.cache/pytest-san/wheelhouses)
    env: dict[str, str] = field(default_factory=dict)  # set for the command on the host
    send_keys: bool = False  # the peers' key files go with the run (lab_view.KEYS_DIR)


@dataclass
class RunOutcome:
    """The command's status, what each step took (seconds) and how the one-off steps went."""

    status: int
    timings: dict[str, float] = field(default_factory=dict)
    wheelhouse: str = ""
    venv_made: bool = False
    reports: list[Path] = field(default_factory=list)


Progress = Callable[[str], None]


def _stderr(line: str) -> None:
    print(f"san-hil run: {line}", file=sys.stderr, flush=True)


def run_remote(request: RunRequest, out: BinaryIO | None = None, progress: Progress = _stderr) -> RunOutcome:
    """Run ``request``: the command's output to ``out`` (stdout), progress to ``progress``."""
    stream = sys.stdout.buffer if out is None else out
    inventory = load_inventory(request.inventory)
    host = find_host(inventory, request.on)
    outcome = RunOutcome(status=1)
    clock = _Clock(outcome.timings)
    with clock("connect"):
        transport = open_transport(host)
    with transport:
        with clock("probe"):
            target = _probe(transport, host.python_argv)
        with clock("wheelhouse"):
            wheelhouse = build_wheelhouse(target, [*request.arguments.requirements, *request.requirements],
                                          request.cache)
        outcome.wheelhouse = wheelhouse.how
        progress(f"{len(wheelhouse.wheels)} wheels for {target.tag} ({wheelhouse.how}) "
                 f"in {outcome.timings['wheelhouse']:.1f} s")
        with clock("venv"):
            venv = ensure_venv(transport, host.python_argv, wheelhouse)
        outcome.venv_made = venv.made
        progress(f"{'made' if venv.made else 'reused'} {venv.path} in {outcome.timings['venv']:.1f} s")
        with clock("push"):
            view = lab_view(inventory, request.on, _exists_on(transport), send_keys=request.send_keys)
            for note in view.notes:
                progress(note)
            files = {**request.arguments.files, INVENTORY_NAME: view.text.encode(),
                     "watchdog.py": (HOST_SCRIPTS / "watchdog.py").read_bytes()}
            pushed = transport.push(dict(files), name="pytest-san-run")
        def fetch_reports(tar_path: str) -> None:
            with clock("reports"):
                tar = transport.fetch(tar_path) if request.arguments.reports else None
            if tar is None and request.arguments.reports:
                progress(f"the host's reports ({tar_path}) could not be read: none brought back")
            if tar is not None:
                outcome.reports = bring_back(tar, request.arguments.reports)
                progress("reports: " + ", ".join(str(p) for p in outcome.reports) if outcome.reports
                         else "the command wrote none of the reports it was asked for")

        with clock("run"):
            outcome.status = _run(transport, host.python_argv, request, venv.python, pushed, stream, fetch_reports,
                                  view.secrets)
    return outcome


class _Clock:
    def __init__(self, into: dict[str, float]) -> None:
        self.into = into

    def __call__(self, name: str) -> _Step:
        return _Step(self.into, name)


class _Step:
    def __init__(self, into: dict[str, float], name: str) -> None:
        self.into, self.name = into, name

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.into[self.name] = time.monotonic() - self.start


def _probe(transport: Transport, python: list[str]) -> HostPython:
    result = transport.run([*python, "-c", PROBE], PROBE_TIMEOUT)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        why = lines[-1] if lines else f"exit status {result.returncode}"
        raise RunError(f"{transport.label}: no usable Python at {' '.join(python)} (ansible_python_interpreter): "
                       f"{why}; the host needs Python 3.10 or later and nothing else")
    try:
        target = HostPython.from_probe(result.stdout)
    except (ValueError, KeyError, IndexError, TypeError):
        raise RunError(f"{transport.label}: {' '.join(python)} did not say what it is: "
                       f"{result.stdout.strip()[:200]!r}") from None
    problem = target.check()
    if problem is not None:
        raise RunError(f"{transport.label}: {problem}")
    return target


def _exists_on(transport: Transport) -> Callable[[str], bool]:
    seen: dict[str, bool] = {}

    def exists(path: str) -> bool:
        if path not in seen:
            seen[path] = transport.run(["test", "-e", path], PROBE_TIMEOUT).returncode == 0
        return seen[path]

    return exists


def _command(request: RunRequest, python: str) -> list[str]:
    argv = with_inventory(request.arguments.argv, mutants=request.mutants)
    if request.color and not request.mutants and not any(a.startswith("--color") for a in argv):
        argv = ("--color=yes", *argv)
    head = ["-m", "hil.cli", "mutants"] if request.mutants else ["-m", "pytest"]
    return [python, *head, *argv]


def _run(transport: Transport, python: list[str], request: RunRequest, venv_python: str, pushed: str,
         out: BinaryIO, fetch_reports: Callable[[str], None], keys: dict[str, bytes]) -> int:
    """Run the command under the watchdog, streaming its output to ``out``; once it has ended, ``fetch_reports``
    gets the path of the host's tar of reports (before the watchdog, told we are done, removes it). Its status."""
    nonce = secrets.token_hex(8)
    spec = {"files": pushed, "tmp": pushed.rsplit("/", 1)[0], "argv": _command(request, venv_python),
            "collect": [r.slot for r in request.arguments.reports], "nonce": f"{RECORD_SEPARATOR}{nonce}",
            "heartbeat": HEARTBEAT, "env": request.env, "secrets": bool(keys)}
    channel = transport.spawn([*python, f"{pushed}/watchdog.py", json.dumps(spec)])
    if keys:  # on stdin, never on a command line or in a pushed directory
        encoded = {path: base64.b64encode(data).decode() for path, data in keys.items()}
        channel.write(json.dumps(encoded).encode() + b"\n")
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(channel, stop), name="san-hil run heartbeat", daemon=True)
    beat.start()
    marker = f"{RECORD_SEPARATOR}{nonce} ".encode()
    try:
        try:
            status, tar_path = _stream(channel, marker, out)
        except KeyboardInterrupt:
            _interrupt(channel, marker, out, fetch_reports)
            raise
        fetch_reports(tar_path)
        return status
    finally:
        stop.set()
        channel.close(grace=STOP_GRACE)  # EOF: the watchdog stops what still runs and removes its directory


def _interrupt(channel: Channel, marker: bytes, out: BinaryIO, fetch_reports: Callable[[str], None]) -> None:
    """Ctrl-C: the watchdog interrupts the command (pytest's own KeyboardInterrupt: fixtures torn down, its summary
    printed, its reports written); what it prints is shown and its reports brought back, within STOP_GRACE s. A
    second Ctrl-C, or no answer, and the channel is closed at once (the watchdog then stops what is left)."""
    try:
        channel.write(INTERRUPT)
        _, tar_path = _stream(channel, marker, out, deadline=time.monotonic() + STOP_GRACE)
        fetch_reports(tar_path)
    except (TransportError, RunError):
        pass


def _heartbeat(channel: Channel, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT):
        try:
            channel.write(b"\n")
        except Exception:  # the channel is gone: the stream's reader says so
            return


def _stream(channel: Channel, marker: bytes, out: BinaryIO, deadline: float | None = None) -> tuple[int, str]:
    """Copy the command's output to ``out`` as it comes, up to the watchdog's status line: (status, tar path)."""
    pending = b""
    while True:
        if deadline is not None and time.monotonic() > deadline:
            out.write(pending)
            raise RunError(f"{channel.host}: the remote run did not stop in time")
        chunk = channel.read_chunk(0.5)
        if chunk is None:
            continue
        if not chunk:
            out.write(pending)
            out.flush()
            raise RunError(f"{channel.host}: the remote run ended without a status (the connection was lost, or "
                           f"its watchdog was killed){_stderr_tail(channel)}")
        pending += chunk
        at = pending.find(marker)
        if at >= 0:
            shown = pending[:at]
            out.write(shown[:-1] if shown.endswith(b"\n") else shown)
            out.flush()
            rest = pending[at + len(marker):]
            while b"\n" not in rest:
                more = channel.read_chunk(5.0)
                if not more:
                    raise RunError(f"{channel.host}: the remote run's status line was cut short")
                rest += more
            status, tar = rest.split(b"\n", 1)[0].decode().split(" ", 1)
            return int(status), tar
        keep = _partial_marker(pending, marker)
        out.write(pending[: len(pending) - keep])
        out.flush()
        pending = pending[len(pending) - keep:]


def _partial_marker(data: bytes, marker: bytes) -> int:
    """How many bytes at the end of ``data`` could be the start of ``marker`` (held back until more comes)."""
    for size in range(min(len(marker) - 1, len(data)), 0, -1):
        if data.endswith(marker[:size]):
            return size
    return 0


def _stderr_tail(channel: Channel) -> str:
    lines = channel.stderr_text(1.0).strip().splitlines()[-5:]
    return "; its last stderr lines: " + " | ".join(lines) if lines else ""
