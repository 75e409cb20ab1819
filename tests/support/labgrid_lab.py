"""A real labgrid lab on localhost for the --san-labgrid tests: labgrid-coordinator and one labgrid-exporter of
the loopback lab hosts (NetworkService resources named after the inventory's hosts), places made through the
coordinator's API. Everything is waited for by its sign (a line, the resources announced), never a time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from hil.inventory import HostConfig
from hil.scheduling.coordinator import CoordinatorError, CoordinatorSession
from tests.support.sshd import free_port

SIGN = 120.0  # seconds a sign (a process's line, a resource announced) may take on a loaded machine

# The exporter's configuration is a Jinja2 template whose line statement prefix is "#": "##" is a comment.
EXPORTER_YAML = """\
## the loopback lab hosts, one NetworkService each (the group is the inventory's host name)
{entries}"""
ENTRY = """\
{name}:
  NetworkService:
    address: '{address}'
    port: {port}
    username: '{user}'
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for_line(process: subprocess.Popen[bytes], log: Path, text: bytes, timeout: float = SIGN) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{process.args!r} did not say {text!r}:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.02)


@dataclass
class LabgridLab:
    directory: Path
    hosts: Sequence[HostConfig]
    port: int = 0
    coordinator: subprocess.Popen[bytes] | None = None
    exporter: subprocess.Popen[bytes] | None = None
    starts: int = 0
    places: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def session(self, name: str = "tests/admin") -> CoordinatorSession:
        return CoordinatorSession(self.address, name)

    def start(self) -> None:
        """The coordinator (in ``directory``: its places.yaml survives a restart), then the exporter, then
        wait until every host's resource is announced."""
        self.starts += 1
        for attempt in range(3):
            if not self.port or attempt:
                self.port = free_port()
            log = self.directory / f"coordinator-{self.starts}.log"
            with log.open("wb") as out:
                self.coordinator = subprocess.Popen(
                    [sys.executable, "-m", "labgrid.remote.coordinator", "-l", self.address], cwd=self.directory,
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env())
            try:
                _wait_for_line(self.coordinator, log, b"listening on ")
                break
            except RuntimeError:
                _stop(self.coordinator)
                if b"address already in use" not in log.read_bytes().lower() and attempt == 2:
                    raise
        config = self.directory / "exporter.yaml"
        config.write_text(EXPORTER_YAML.format(entries="".join(
            ENTRY.format(name=h.name, address=h.host, port=h.port, user=h.user or "") for h in self.hosts)))
        log = self.directory / f"exporter-{self.starts}.log"
        with log.open("wb") as out:
            self.exporter = subprocess.Popen(
                [sys.executable, "-m", "labgrid.remote.exporter", "-c", self.address, "-n", "lab", "--hostname",
                 "127.0.0.1", str(config)], cwd=self.directory, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=_env())
        self.wait_for_resources(len(self.hosts))

    def wait_for_resources(self, count: int) -> None:
        deadline = time.monotonic() + SIGN
        session = self.session()
        try:
            while sum(1 for r in session.resources().values() if r.available) < count:
                if time.monotonic() > deadline or (self.exporter is not None and self.exporter.poll() is not None):
                    log = sorted(self.directory.glob("exporter-*.log"))[-1]
                    raise RuntimeError(f"the exporter did not announce {count} hosts:\n{log.read_text()[-3000:]}")
                time.sleep(0.05)
        finally:
            session.close()

    def add_places(self, places: Mapping[str, tuple[Sequence[str], Mapping[str, str]]]) -> None:
        """Places name -> (host names, tags); each host a named match node1, node2, ..."""
        session = self.session()
        try:
            for name, (hosts, tags) in places.items():
                matches = [(f"lab/{h}/NetworkService", f"node{i}") for i, h in enumerate(hosts, 1)]
                session.add_place(name, matches, tags)
                self.places[name] = (list(hosts), dict(tags))
        finally:
            session.close()

    def restart(self) -> None:
        """Stop the coordinator (the exporter exits with it, as labgrid's does) and start both again, once the
        coordinator has saved its places (places.yaml, written on its 15 s tick): a lab's places are old."""
        saved = self.directory / "places.yaml"
        deadline = time.monotonic() + SIGN
        while not saved.exists() or not all(f"{name}:" in saved.read_text() for name in self.places):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the coordinator did not save its places in {saved}")
            time.sleep(0.1)
        _stop(self.coordinator)
        _stop(self.exporter)
        self.start()

    def stop(self) -> None:
        _stop(self.exporter)
        _stop(self.coordinator)

    def acquired(self) -> dict[str, str | None]:
        """Place -> who acquired it (None: no one)."""
        with suppress(CoordinatorError):
            session = self.session()
            try:
                return {name: p.acquired for name, p in session.places().items()}
            finally:
                session.close()
        return {}
