"""The agent's bundle (hil/agent/server.py ``agent_files``) is all a lab host gets: every module the agent and
its engines import must be in it. A module moved out of the bundle's trees (a helper the switch imports, say)
otherwise shows only on a lab, as an agent that dies before its hello.

Of pytest_san the bundle holds the folder ``pytest_san/spi`` alone, and the host runs it with its system python3:
the standard library only (pyproject.toml's import-linter contract; here no site-packages), Python 3.9 or later
(ruff lints the folder with target version py39; here a Python 3.9 imports each of its modules)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hil.agent import server
from tests.hil.agent.test_agent_floor import find_python39

ROOT = Path(__file__).resolve().parents[3]

# -I -S: no site-packages (the editable install would find what the bundle lacks), no environment. Each module
# named after the bundle's directory is imported, and every module of hil and pytest_san loaded must be the
# bundle's.
IMPORT = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); "
          "[importlib.import_module(name) for name in sys.argv[2:]]; "
          "assert all(m.__file__.startswith(sys.argv[1]) for m in list(sys.modules.values()) "
          "if getattr(m, '__file__', None) and m.__name__.split('.')[0] in ('hil', 'pytest_san'))")


# The emulator driven a little where the agent's emulator engine drives it: 3.10 calls in function bodies
# (``zip(..., strict=True)``, say) are no syntax and no import, and show only when they run.
DRIVE = """
import sys
sys.path.insert(0, sys.argv[1])
from pytest_san.spi.contract import Access, Status
from pytest_san.spi.emulator import EmulatorBackend

backend = EmulatorBackend()
pa, pb = backend.nodes[0].default_process, backend.nodes[1].default_process
sa, sb = backend.connect_sockets(pa, pb)
src, dst = pa.alloc(8192), pb.alloc(8192)
src.write(b"x" * 8192)
proxy = pa.node.proxy
proxy.pin(src)
assert proxy.physical_runs(src)
proxy.free(proxy.allocate(4096))
handle = pa.node.provider.register_memory(sa, src, Access.READ)
desc = pb.node.provider.register_rdma_memory(sb, dst, Access.WRITE)
done = pa.node.provider.rdma_write(sa, [(src, handle)], desc, 0).wait(10)
assert done.status is Status.SUCCESS and dst.read(8192) == b"x" * 8192, done
"""


def unpack(directory: Path) -> list[str]:
    """The bundle written below ``directory`` as a host gets it; its paths."""
    names = []
    for name, content in server.agent_files(ROOT):
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(content)
        names.append(name)
    return names


def spi_modules(names: list[str]) -> list[str]:
    return [name.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for name in names
            if name.startswith("pytest_san/spi/")]


def test_the_agent_and_its_emulator_engine_import_from_the_bundle_alone(tmp_path: Path) -> None:
    unpack(tmp_path)
    done = subprocess.run([sys.executable, "-I", "-S", "-c", IMPORT, str(tmp_path), "hil.agent.server",
                           "hil.agent.engines.emulator", "hil.agent.engines.verbs.witness", "hil.agent.rdma_netlink"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_of_pytest_san_the_bundle_holds_the_folder_spi_alone(tmp_path: Path) -> None:
    names = unpack(tmp_path)
    ours = sorted(name for name in names if name.startswith("pytest_san/"))
    folder = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "pytest_san/spi").rglob("*.py"))
    assert ours == ["pytest_san/__init__.py", *folder]
    # Its __init__ is the bundle's stand-in, not the package's (which imports every part of pytest_san).
    assert (tmp_path / "pytest_san/__init__.py").read_bytes() == server.PACKAGE_STUB[1]


def test_the_pushed_folders_are_the_ones_their_import_contracts_guard() -> None:
    """pyproject.toml's import-linter contracts name what is pushed: pytest_san's pushed folder imports the
    standard library only, and the agent and the wire import nothing else of pytest_san."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    ours = [tree.replace("/", ".") for tree in server.AGENT_TREES if tree.startswith("pytest_san/")]
    hils = [tree.replace("/", ".") for tree in server.AGENT_TREES if tree.startswith("hil/")]
    assert ours == ["pytest_san.spi"]
    standalone = [c for c in contracts if {"pytest_san.*", "hil"} <= set(c.get("forbidden_modules", []))]
    assert [c["source_modules"] for c in standalone] == [ours]
    to_ours = [c for c in contracts if c.get("source_modules") == hils and "pytest_san.*" in c["forbidden_modules"]]
    assert [c.get("ignore_imports") for c in to_ours] == [[f"hil.** -> {name}.**" for name in ours]]


def test_the_pushed_code_is_python_3_9_code(tmp_path: Path) -> None:
    """Every module of ``pytest_san.spi``, the agent and its emulator engine import on Python 3.9 from the
    bundle alone; every file of the bundle compiles there (the verbs engine imports pyverbs: it is compiled,
    not imported); the emulator pins, allocates, registers and writes there."""
    python39 = find_python39()
    if python39 is None:
        pytest.skip("no Python 3.9 here (tests/hil/agent/test_agent_floor.py says where it looked)")
    names = unpack(tmp_path)
    modules = [*spi_modules(names), "hil.agent.server", "hil.agent.engines.emulator", "hil.agent.rdma_netlink"]
    done = subprocess.run([python39, "-I", "-S", "-c", IMPORT, str(tmp_path), *modules], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([python39, "-I", "-S", "-m", "compileall", "-q", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run([python39, "-I", "-S", "-c", DRIVE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
