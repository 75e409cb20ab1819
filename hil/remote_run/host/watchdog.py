"""On the lab host: run the command in its own process group, and end it with the SSH channel. Python 3.9+.

    python3 watchdog.py SPEC_JSON

SPEC: ``files`` (the pushed directory: copied into a fresh working directory under ``tmp``), ``argv`` (run there,
stdout and stderr to ours: the channel), ``collect`` (paths, relative to the working directory, packed into a tar
once it ends), ``nonce``, ``heartbeat`` (seconds) and ``secrets`` (true: the first line on stdin holds files for
the working directory alone, the peers' SSH keys). The controller writes a byte at least every ``heartbeat``
s; EOF on stdin (Ctrl-C, a killed or lost controller: sshd closes the channel), silence for 6 heartbeats (a
connection dropped without a word) or TERM, HUP, INT stop the command, and so does a ``\\x03`` on stdin
(Ctrl-C on the controller's side: the status line and the reports still follow): INT to its group (pytest's own
interrupt: fixtures torn down, agents and leases gone), then TERM, then KILL. Once the command ends its status
follows on a line ``<nonce> <status> <tar>``; the working directory is removed when stdin ends.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

STOP_STEPS = ((signal.SIGINT, 4.0), (signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0))
MISSED_HEARTBEATS = 6
STATUS_WAIT = 600.0  # seconds the controller gets to fetch the reports once the command has ended
SECRETS_LIMIT = 1 << 20
INTERRUPT = b"\x03"  # on stdin: the controller's Ctrl-C

_signalled: list[int] = []


def _note(signum: int, _frame: object) -> None:
    _signalled.append(signum)


def _stop(child: subprocess.Popen[bytes]) -> None:
    for signum, wait in STOP_STEPS:
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if child.poll() is not None:
                with contextlib.suppress(ProcessLookupError):  # the command is gone: what it left goes too
                    os.killpg(child.pid, signal.SIGKILL)
                return
            time.sleep(0.05)


def _alive(last: list[float], heartbeat: float, timeout: float) -> str:
    """Wait up to ``timeout`` s on stdin: ``gone`` on EOF, on a signal or on missed heartbeats, ``interrupt`` when
    the controller asks for one (Ctrl-C on its side), else ``ok``."""
    if _signalled:
        return "gone"
    try:
        ready, _, _ = select.select([0], [], [], timeout)
    except InterruptedError:
        return "gone" if _signalled else "ok"
    if ready:
        data = os.read(0, 4096)
        if not data:
            return "gone"
        last[0] = time.monotonic()
        if INTERRUPT in data:
            return "interrupt"
    if _signalled or time.monotonic() - last[0] >= heartbeat * MISSED_HEARTBEATS:
        return "gone"
    return "ok"


def _receive_secrets(work: str) -> None:
    """The first line on stdin: {relative path: base64} of files only this run may read (the peers' SSH keys),
    written with mode 0600 in the working directory, which is removed with the run."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk or len(line) > SECRETS_LIMIT:
            raise SystemExit("the controller went away before sending the run's keys")
        line += chunk
    for path, data in json.loads(line).items():
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise SystemExit(f"refusing to write {path!r} outside the working directory")
        where = os.path.join(work, *parts)
        os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
        descriptor = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(base64.b64decode(data))


def _pack(work: str, collect: list[str]) -> str:
    where = os.path.join(work, ".san-reports.tar")
    with tarfile.open(where, "w") as tar:
        for path in collect:
            full = os.path.join(work, path)
            if os.path.lexists(full):
                tar.add(full, arcname=path)
    return where


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _note)
    heartbeat = float(spec["heartbeat"])
    work = tempfile.mkdtemp(prefix="pytest-san-work-", dir=spec["tmp"])
    try:
        shutil.copytree(spec["files"], work, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".complete", "watchdog.py"))
        if spec.get("secrets"):
            _receive_secrets(work)
        for path in spec["collect"]:
            os.makedirs(os.path.join(work, path), exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **spec.get("env", {}))
        sys.stdout.flush()
        child = subprocess.Popen(spec["argv"], cwd=work, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=env)
        last = [time.monotonic()]
        while child.poll() is None:
            state = _alive(last, heartbeat, 0.5)
            if state == "gone":
                _stop(child)
                return 1
            if state == "interrupt":  # stopped, then its status and reports as for any end
                _stop(child)
        _stop(child)  # anything it left behind in its group
        status = child.returncode if child.returncode >= 0 else 128 - child.returncode
        tar = _pack(work, spec["collect"])
        sys.stdout.write(f"\n{spec['nonce']} {status} {tar}\n")
        sys.stdout.flush()
        deadline = time.monotonic() + STATUS_WAIT
        while time.monotonic() < deadline and _alive(last, heartbeat, 0.5) != "gone":
            pass
        return status
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
