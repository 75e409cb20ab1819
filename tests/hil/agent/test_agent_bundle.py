"""The agent's bundle (hil/agent/server.py ``agent_files``) is all a lab host gets: every module the agent and
its engines import must be in it. A module moved out of the bundle's trees (a helper the switch imports, say)
otherwise shows only on a lab, as an agent that dies before its hello."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hil.agent import server

ROOT = Path(__file__).resolve().parents[3]


def test_the_agent_and_its_emulator_engine_import_from_the_bundle_alone(tmp_path: Path) -> None:
    for name, content in server.agent_files(ROOT):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    # -I -S: no site-packages (the editable install would find what the bundle lacks), no environment.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import hil.agent.server, hil.agent.engines.emulator, "
            "hil.agent.engines.verbs.witness, hil.agent.rdma_netlink; "
            "assert all(m.__file__.startswith(sys.argv[1]) for m in list(sys.modules.values()) "
            "if getattr(m, '__file__', None) and m.__name__.split('.')[0] in ('hil', 'pytest_san'))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
