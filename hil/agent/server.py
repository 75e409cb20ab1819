"""The agent's request loop and the files that make up an agent. Python 3.9+, standard library."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from hil.agent.dispatch import METHODS, Dispatcher, Registry
from hil.rpc import framing as wire

# What is pushed to a host: the agent and the parts of pytest_san the emulator engine runs.
AGENT_TREES = ("hil/agent", "hil/rpc", "pytest_san/emulator", "pytest_san/switch")
AGENT_FILES = ("hil/__init__.py", "pytest_san/__init__.py", "pytest_san/contract.py", "pytest_san/errors.py",
               "pytest_san/types.py",
               "pytest_san/protocols.py", "pytest_san/burst.py")


def agent_files(root: Path) -> Iterator[tuple[str, bytes]]:
    """(relative path, content) of every file of the agent below ``root``."""
    for name in AGENT_FILES:
        yield name, (root / name).read_bytes()
    for tree in AGENT_TREES:
        for path in sorted((root / tree).rglob("*.py")):
            yield path.relative_to(root).as_posix(), path.read_bytes()


def make_engine(name: str, host: str, options: dict[str, Any]) -> Any:
    if name == "emulator":
        from hil.agent.engines.emulator import EmulatorEngine

        return EmulatorEngine(host, **options)
    from hil.agent.engines.verbs.engine import VerbsEngine  # imports pyverbs: only where it is asked for

    return VerbsEngine(host, **options)


def _handlers(engine: Any) -> dict[tuple[str, str], Any]:
    from pytest_san import burst
    from pytest_san.types import DeviceDescription

    def fault(_engine: Any, name: str, *args: Any) -> Any:
        if name not in ("fail_allocations", "drop_link", "restore_link", "hold", "release"):
            raise LookupError(f"no fault named {name!r}")
        return getattr(engine.faults, name)(*args)

    def set_nolowmem(proxy: Any, value: bool) -> None:
        if hasattr(proxy, "set_nolowmem"):
            proxy.set_nolowmem(value)  # a real host refuses: it has no NOLOWMEM mode
        else:
            proxy.nolowmem = value

    def get_dma_adapter(proxy: Any, description: Any) -> Any:
        if type(description) is dict and set(description) == {"$dd"}:  # a DeviceDescription, field by field
            fields = description["$dd"]
            known = {f.name for f in dataclasses.fields(DeviceDescription)}
            if type(fields) is not dict or not set(fields) <= known:
                raise TypeError(f"not the fields of a DeviceDescription: {fields!r:.80}")
            description = DeviceDescription(**fields)
        return proxy.get_dma_adapter(description)  # anything else: for the proxy to refuse

    def buffer_read(process: Any, address: Any, length: Any, n: Any, offset: Any) -> Any:
        """A buffer's read, checked as the engine checks its own buffers (the whole range mapped)."""
        buffer = engine.resolve_buffer(process, address, length)
        if hasattr(buffer, "read"):
            return buffer.read(n, offset)
        return process.read(address + offset, n)  # an engine whose buffers are only names

    def buffer_write(process: Any, address: Any, length: Any, data: Any, offset: Any) -> Any:
        buffer = engine.resolve_buffer(process, address, length)
        if hasattr(buffer, "write"):
            return buffer.write(data, offset)
        return process.write(address + offset, data)

    return {
        ("process", "buffer_read"): buffer_read,
        ("process", "buffer_write"): buffer_write,
        ("proxy", "set_nolowmem"): set_nolowmem,
        ("proxy", "get_dma_adapter"): get_dma_adapter,
        ("socket", "state"): engine.socket_state,
        ("allocation", "info"): lambda a: [a.length, [list(r) for r in a.physical_runs]],
        ("engine", "faults"): fault,
        # The engine's own burst where it has one (verbs: in the child), else the SPI loop, here on the host.
        ("provider", "rdma_write_burst"): lambda p, s, b, d, o, n, w: burst.rdma_write_burst(
            p, s, b, d, o, count=n, depth=w),
        ("provider", "rdma_read_burst"): lambda p, s, b, d, o, n, w: burst.rdma_read_burst(
            p, s, b, d, o, count=n, depth=w),
    }


class _Encoder:
    def __init__(self, registry: Registry, kind_of: Any) -> None:
        self._registry = registry
        self._kind_of = kind_of

    def __call__(self, value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return int(value) if isinstance(value, enum.Enum) else value
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, (list, tuple)):
            return [self(v) for v in value]
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        if hasattr(value, "status") and hasattr(value, "bytes"):
            return {"status": value.status.value, "bytes": value.bytes}
        if hasattr(value, "process") and hasattr(value, "address") and hasattr(value, "length"):
            return {"$buf": [self._registry.ref(value.process)["$o"], value.address, value.length]}
        if hasattr(value, "refs") and hasattr(value, "kind"):
            return {"kind": value.kind, "address": value.address, "length": value.length,
                    "access": int(value.access), "refs": value.refs}
        if self._kind_of(value) in METHODS:
            return self._registry.ref(value)
        return str(value)


def serve(engine_name: str, host: str, options: str, content_hash: str, stdin: BinaryIO,
          stdout: BinaryIO) -> int:
    engine = make_engine(engine_name, host, json.loads(options))
    kind_of = engine.kind_of if hasattr(engine, "kind_of") else _emulator_kind_of()
    registry = Registry(kind_of)
    encode = _Encoder(registry, kind_of)
    for obj in engine.pinned():
        registry.pinned.add(registry.ref(obj)["$o"])
    dispatcher = Dispatcher(registry, engine.resolve_buffer, encode, _handlers(engine))
    hello = {"protocol": wire.PROTOCOL_VERSION, "hash": content_hash, "pid": os.getpid(),
             "engine_ref": encode(registry.ref(engine)), **encode(engine.hello())}
    stdout.write(wire.encode({"hello": hello}))
    stdout.flush()
    try:
        for line in stdin:  # ends when the controller goes away
            if not line.strip():
                continue
            stdout.write(dispatcher.handle_line(line))  # never raises: a bad request gets an error reply
            stdout.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        engine.close()  # every registration, allocation and child process goes with us
    return 0


def _emulator_kind_of() -> Any:
    from hil.agent.engines.emulator import kind_of

    return kind_of
