"""A port that accepts TCP connections and never sends a byte, and pytest sessions run against it.

What an SSH client meets at a wrong port, behind a hung sshd, or at a firewall that accepts and drops.
paramiko once gave up on it with "No existing session" while its thread still waited for the banner, and
that thread, once the connection was closed, logged a traceback while pytest parsed a test's source: in
Python 3.11 both use ast, whose recursion depth is not per thread, and the session ended in
``INTERNALERROR> SystemError: AST constructor recursion depth mismatch``.

``python -m tests.support.silent_port --runs 20`` repeats such a session and counts INTERNALERRORs
(docs/lab-hosts.md records a run).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

from tests.support.lab_hosts import pytest_env

PORT_ENV = "SAN_SILENT_PORT"

# One nested session: each case connects (paramiko would give up its handshake at 0.2 s and wait 0.5 s
# for the banner), checks that no paramiko thread is left, then fails on purpose, so that pytest parses
# the test's source while a thread that outlived its connection would still be logging.
SESSION = '''
import os
import threading

import paramiko
import pytest

from hil.inventory import HostConfig
from hil.transport import TransportError, open_transport

PORT = int(os.environ["{env}"])


@pytest.mark.parametrize("attempt", range({cases}))
def test_silent_port(attempt):
    host = HostConfig(name="silent", host="127.0.0.1", port=PORT, user="nobody")
    with pytest.raises(TransportError) as info:
        open_transport(host, ssh_config=None, connect_timeout=0.2, banner_timeout=0.5)
    left = [t.name for t in threading.enumerate() if isinstance(t, paramiko.Transport)]
    assert left == [], "paramiko threads outlived the connection"
    raise AssertionError(str(info.value))
'''


class SilentPort:
    """A listener on 127.0.0.1 that accepts every connection, holds it open and never writes."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="silent port", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            self._held.append(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._listener.close()
        self._thread.join(5)
        for conn in self._held:
            conn.close()

    def __enter__(self) -> SilentPort:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def write_session(directory: Path, cases: int) -> Path:
    path = directory / "test_silent_port.py"
    path.write_text(SESSION.format(env=PORT_ENV, cases=cases))
    return path


def run_session(directory: Path, port: int, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    """A nested pytest over ``directory`` (as written by write_session), against ``port``."""
    env = {**pytest_env(), PORT_ENV: str(port)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", str(directory)],
                          cwd=directory, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def clean(done: subprocess.CompletedProcess[str], port: int, cases: int) -> bool:
    """Whether a session ran every case to its failure on purpose, each saying why, with no INTERNALERROR."""
    output = done.stdout + done.stderr
    # the line pytest shows for the failure on purpose, reached only once no paramiko thread was left
    said = output.count(f"AssertionError: silent (127.0.0.1:{port}): no SSH banner from 127.0.0.1:{port} within 0.5 s")
    return done.returncode == 1 and "INTERNALERROR" not in output and f"{cases} failed" in output and said >= cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cases", type=int, default=10, help="connections per session")
    args = parser.parse_args()
    if args.runs < 1 or args.cases < 1:
        parser.error("--runs and --cases must be at least 1")
    bad = 0
    with tempfile.TemporaryDirectory(prefix="silent-port-") as tmp, SilentPort() as port:
        write_session(Path(tmp), args.cases)
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            done = run_session(Path(tmp), port.port)
            output = done.stdout + done.stderr
            ok = clean(done, port.port, args.cases)
            bad += not ok
            print(f"run {run}: exit {done.returncode}, {'ok' if ok else 'BAD'}, {time.monotonic() - started:.1f} s",
                  flush=True)
            if not ok:
                print(output[-3000:])
    print(f"{args.runs - bad} of {args.runs} sessions clean ({args.cases} silent-port connections each)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
