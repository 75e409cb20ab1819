"""``san-hil lab reproduce rsockets-rclose-live-riomap`` (hil/lab/reproduce_rsockets.py).

Without a lab: the reproducer is registered, cannot tell on a machine without an RDMA device (the real module,
exit 2), and turns the agent driver's outcomes into its verdict; the last with a stand-in program in place of
the rsockets child (plumbing only: it proves nothing of rsockets). On a lab it runs for real: docs/lab.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hil.agent.observe import driver
from hil.agent.observe.driver import ObservedChild
from hil.lab import reproduce_rsockets
from hil.lab.reproduce import REPRODUCERS, remote_command

NAME = "rsockets-rclose-live-riomap"

STAND_IN = textwrap.dedent("""
    import json, os, sys
    CLOSE = sys.argv[1]
    ANSWERS = {"rsocket": 3, "iomapsize": 0, "listen": {"address": "10.0.0.1", "port": 7471}, "accept": 4,
               "connect": 0, "alloc": {"buf": 1, "length": 4096, "address": 4096}, "iomap": 0}
    print(json.dumps({"id": 0, "result": {"pid": os.getpid(), "library": "stand-in"}}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["call"] == "close":
            if CLOSE == "spin":
                while True:
                    pass
            print(json.dumps({"id": req["id"], "error": {"call": "close", "errno": 9, "message": "EBADF"}}
                             if CLOSE == "fail" else {"id": req["id"], "result": 0}), flush=True)
            continue
        print(json.dumps({"id": req["id"], "result": ANSWERS[req["call"]]}), flush=True)
""")


class StandInEngine:
    """What the reproducer uses of the verbs engine: ``spawn_observed``, here the stand-in program."""

    def __init__(self, program: Path, close: str) -> None:
        self.argv = [sys.executable, str(program), close]
        self.children: list[ObservedChild] = []

    def spawn_observed(self, program: str) -> ObservedChild:
        assert program == "rsockets"
        child = ObservedChild(None, read=lambda: {kind: [] for kind in driver.KINDS}, argv=self.argv)
        self.children.append(child)
        return child


def _verdict(tmp_path: Path, close: str, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], StandInEngine]:
    program = tmp_path / "stand_in.py"
    program.write_text(STAND_IN)
    monkeypatch.setattr(reproduce_rsockets, "DEADLINE", 0.5)
    engine = StandInEngine(program, close)
    return reproduce_rsockets.rsockets_rclose_live_riomap(engine), engine


def test_it_is_registered_and_runs_in_the_guest_as_the_others() -> None:
    assert REPRODUCERS[NAME] is reproduce_rsockets.rsockets_rclose_live_riomap
    assert remote_command(NAME)[-3:] == ["-m", "hil.lab.reproduce", NAME]


def test_without_a_device_it_cannot_tell() -> None:
    if Path("/sys/class/infiniband").is_dir():
        pytest.skip("this machine has RDMA devices: the reproducer runs here for real")
    result = subprocess.run([sys.executable, "-m", "hil.lab.reproduce", NAME], capture_output=True, text=True,
                            timeout=120, check=False, cwd=Path(__file__).resolve().parents[3])
    said: dict[str, Any] = json.loads(result.stdout)
    assert result.returncode == 2 and said["verdict"] == "inconclusive" and said["name"] == NAME


def test_a_close_that_does_not_return_is_still_there_with_its_steps(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    said, engine = _verdict(tmp_path, "spin", monkeypatch)
    assert said["verdict"] == "still there"
    assert "did not return within 0.5 s" in said["detail"] and "after the kill: nothing" in said["detail"]
    assert said["steps"][-2:] == ["iomap(fd=4, buf=1, offset=0)", "close(fd=4)"]
    assert not any(child.alive for child in engine.children)


def test_a_close_that_returns_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said, engine = _verdict(tmp_path, "return", monkeypatch)
    assert said["verdict"] == "gone" and "rclose returned 0" in said["detail"]
    assert not any(child.alive for child in engine.children)


def test_a_close_that_fails_cannot_tell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said, _ = _verdict(tmp_path, "fail", monkeypatch)
    assert said["verdict"] == "inconclusive" and "EBADF" in said["detail"]
