"""The agent's request loop and the files that make up an agent. Python 3.9+, standard library."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from hil.agent.dispatch import Dispatcher, EngineCodec, Registry
from hil.rpc import framing as wire

STARTUP_FAILED = 5  # exit status of an agent whose engine could not start (its hello says why)

# What is pushed to a host: the agent, the wire and ``pytest_san.spi``, all the agent needs of pytest_san (the
# standard library only: pyproject.toml's import-linter contract for it). There pytest_san is that folder alone:
# its ``__init__`` is PACKAGE_STUB, not the package's own (which imports the whole package), and a regular package
# first on the agent's path, so a pytest-san installed for the host's python3 never stands in for what was pushed.
AGENT_TREES = ("hil/agent", "hil/rpc", "pytest_san/spi")
AGENT_FILES = ("hil/__init__.py",)
PACKAGE_STUB = ("pytest_san/__init__.py", b'"""pytest_san on a lab host: pytest_san.spi, pushed with the agent."""\n')


def agent_files(root: Path) -> Iterator[tuple[str, bytes]]:
    """(relative path, content) of every file of the agent below ``root``."""
    for name in AGENT_FILES:
        yield name, (root / name).read_bytes()
    yield PACKAGE_STUB
    for tree in AGENT_TREES:
        for path in sorted((root / tree).rglob("*.py")):
            yield path.relative_to(root).as_posix(), path.read_bytes()


class Engine(Protocol):
    """What the agent needs of an engine besides the objects it hands out (emulator.py, verbs/engine.py)."""

    @property
    def faults(self) -> object: ...  # the emulator's faults, or None
    def hello(self) -> dict[str, object]: ...
    def pinned(self) -> list[object]: ...
    def resolve_buffer(self, process: Any, address: int, length: int) -> object: ...
    def socket_state(self, sock: Any) -> list[bool]: ...
    def close(self) -> None: ...


def make_engine(name: str, host: str, options: dict[str, Any]) -> Engine:
    if name == "emulator":
        from hil.agent.engines.emulator import EmulatorEngine

        return EmulatorEngine(host, **options)
    from hil.agent.engines.verbs.engine import VerbsEngine  # imports pyverbs: only where it is asked for

    return VerbsEngine(host, **options)


def _handlers(engine: Engine) -> dict[tuple[str, str], Callable[..., object]]:
    """(kind, method) -> what answers it, where an attribute of the object does not. The objects are the
    engine's (of whichever engine): arbitrary here."""
    from pytest_san.spi import burst

    def fault(_engine: object, name: str, *args: Any) -> object:
        if name not in ("fail_allocations", "drop_link", "restore_link", "hold", "release"):
            raise LookupError(f"no fault named {name!r}")
        return getattr(engine.faults, name)(*args)

    def set_nolowmem(proxy: Any, value: bool) -> None:
        proxy.set_nolowmem(value)  # a real host refuses: it has no NOLOWMEM mode

    def buffer_read(process: Any, address: int, length: int, n: Any, offset: Any) -> object:
        """A buffer's read, checked as the engine checks its own buffers (the whole range mapped)."""
        buffer = engine.resolve_buffer(process, address, length)
        if hasattr(buffer, "read"):
            return buffer.read(n, offset)
        return process.read(address + offset, n)  # an engine whose buffers are only names

    def buffer_write(process: Any, address: int, length: int, data: Any, offset: Any) -> object:
        buffer = engine.resolve_buffer(process, address, length)
        if hasattr(buffer, "write"):
            return buffer.write(data, offset)
        return process.write(address + offset, data)

    return {
        ("process", "buffer_read"): buffer_read,
        ("process", "buffer_write"): buffer_write,
        ("proxy", "set_nolowmem"): set_nolowmem,
        ("socket", "state"): engine.socket_state,
        ("allocation", "info"): lambda a: [a.length, [list(r) for r in a.physical_runs]],
        ("engine", "faults"): fault,
        # The engine's own burst where it has one (verbs: in the child), else the SPI loop, here on the host.
        ("provider", "rdma_write_burst"): lambda p, s, b, d, o, n, w: burst.rdma_write_burst(
            p, s, b, d, o, count=n, depth=w),
        ("provider", "rdma_read_burst"): lambda p, s, b, d, o, n, w: burst.rdma_read_burst(
            p, s, b, d, o, count=n, depth=w),
    }


def serve(engine_name: str, host: str, options: str, content_hash: str, stdin: BinaryIO,
          stdout: BinaryIO) -> int:
    engine: Engine | None = None
    try:
        engine = make_engine(engine_name, host, json.loads(options))
        kind_of: Callable[[object], str] = engine.kind_of if hasattr(engine, "kind_of") else _emulator_kind_of()
        registry = Registry(kind_of)
        codec = EngineCodec(registry, engine.resolve_buffer)
        for obj in engine.pinned():
            registry.pin(obj)
        ahead = _Ahead(engine) if hasattr(engine, "prefetch") else None
        dispatcher = Dispatcher(codec, _handlers(engine), ahead)
        hello = {"protocol": wire.PROTOCOL_VERSION, "hash": content_hash, "pid": os.getpid(),
                 "kernel": os.uname().release,  # the report's "kernel" (docs/downstream.md)
                 "engine_ref": codec.encode(engine), **{k: codec.encode(v) for k, v in engine.hello().items()}}
    except Exception as exc:  # no such device, GID index not set, port down, no pyverbs: say why, then go
        if engine is not None:
            with contextlib.suppress(Exception):  # the reason to report is the first failure
                engine.close()
        return _cannot_start(stdout, content_hash, engine_name, options, exc)
    stdout.write(wire.encode({"hello": hello}))
    stdout.flush()
    try:
        for lines in _arrivals(stdin):  # ends when the controller goes away
            for reply in dispatcher.handle_lines(lines):  # never raises: a bad request gets an error reply
                stdout.write(reply)
                stdout.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        engine.close()  # every registration, allocation and child process goes with us
    return 0


def _arrivals(stdin: BinaryIO) -> Iterator[list[bytes]]:
    """The request lines that arrived together (what one read finds), blank ones left out, until EOF."""
    read = getattr(stdin, "read1", None) or stdin.read
    pending = b""
    while True:
        chunk = read(1 << 16)
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop() if chunk else b""
        lines = [line + b"\n" for line in lines if line.strip()]
        if lines:
            yield lines
        if not chunk:
            if pending.strip():
                yield [pending]
            return


class _Ahead:
    """The dispatcher's Prefetch, for an engine that asks read-only requests ahead (the verbs engine)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def ask(self, kind: str, method: str, target: Any, args: list[Any]) -> bool:
        return bool(self._engine.prefetch(kind, method, target, args))

    def forget(self) -> None:
        self._engine.forget_prefetched()


def _cannot_start(stdout: BinaryIO, content_hash: str, engine_name: str, options: str, exc: Exception) -> int:
    """The engine could not start: a hello that says why (the controller puts it in its error, so the test
    report names the reason, not just an agent gone), the traceback on stderr; exit STARTUP_FAILED."""
    traceback.print_exc(file=sys.stderr)
    try:
        given = {k: v for k, v in json.loads(options).items() if v is not None}
    except (ValueError, AttributeError):
        given = {"options": options}
    failed = {"engine": engine_name, "options": given, "kind": type(exc).__name__, "message": str(exc) or repr(exc)}
    hello = {"protocol": wire.PROTOCOL_VERSION, "hash": content_hash, "pid": os.getpid(), "failed": failed}
    stdout.write(wire.encode({"hello": hello}))
    stdout.flush()
    return STARTUP_FAILED


def _emulator_kind_of() -> Callable[[object], str]:
    from hil.agent.engines.emulator import kind_of

    return kind_of
