"""The controller's errors: an agent failing (naming its host), a host leased by another.

``failure`` is the controller's fallback for ``hil.rpc.errors.rebuild``: what an agent's error that is
not the contract's (SanError, TimeoutError, ValueError, TypeError) becomes here.
"""

from __future__ import annotations

from collections.abc import Mapping


class AgentError(RuntimeError):
    """The agent failed in a way that is not a SAN error: the message names the host."""


class AgentStartError(AgentError):
    """The agent could not start its engine (no such device, GID index not set, no pyverbs, ...): the message
    names the host and, on its first line, the agent's reason; then the agent's traceback. ``host``: the
    host's inventory name (the plugin remembers the failure per host for the session)."""

    def __init__(self, message: str, host: str = "") -> None:
        super().__init__(message)
        self.host = host

    def __reduce__(self) -> tuple[type[AgentStartError], tuple[str, str]]:
        return type(self), (str(self), self.host)


def start_failure(where: str, failed: Mapping[str, object], trace: str, host: str = "") -> AgentStartError:
    """The error for an agent whose hello says ``failed`` (hil/agent/server.py): reason first, on one line."""
    options = failed.get("options")
    given = ", ".join(f"{k} {v!r}" for k, v in options.items()) if isinstance(options, Mapping) else ""
    engine = f"the {failed.get('engine', '?')} engine" + (f" ({given})" if given else "")
    text = f"{where}: the agent could not start: {engine}: {failed.get('kind', '?')}: {failed.get('message', '')}"
    lines = trace.strip().splitlines()[-20:]
    return AgentStartError(text + ("\nthe agent's stderr:\n  " + "\n  ".join(lines) if lines else ""), host)


class BackendBroken(AgentError):
    """A host's agent died and could not be started again: the backend serves no more tests. The message
    names the host, how its agent died and why it could not start again; it is raised again, unchanged, by
    every later reset (no test starts the agent again)."""


class HostBusy(AgentError):
    """The host's lease is held by another process: an agent (of another worker, run, controller or user), or
    any process holding its name; ``holder`` is the kernel's word on it (hil/agent/lease.py ``read_holder``)."""

    def __init__(self, host: str, holder: Mapping[str, object], message: str) -> None:
        super().__init__(message)
        self.host = host
        self.holder = dict(holder)

    def __reduce__(self) -> tuple[type[HostBusy], tuple[str, dict[str, object], str]]:
        return type(self), (self.host, self.holder, str(self))


def failure(where: str, kind: str, message: str, trace: str | None) -> AgentError:
    """The agent failing in a call (``kind``: the class of what it raised), at ``where`` (the host)."""
    text = f"{where}: {kind}: {message}" + (f"\n{trace}" if trace else "")
    cls = _ALSO_AGENT_ERROR.get(kind, AgentError)
    return cls(text)  # an engine's built-in failure is still an AgentError (host, traceback), and what it was


def _also_agent_error(base: type[Exception]) -> type[AgentError]:
    cls = type(f"Agent{base.__name__}", (AgentError, base), {"__module__": __name__})
    globals()[cls.__name__] = cls  # importable by name: it pickles (xdist)
    return cls


# Failures of the engine in a call (a bug it has in-process too): caught as the built-in they are.
_ALSO_AGENT_ERROR: dict[str, type[AgentError]] = {
    base.__name__: _also_agent_error(base)
    for base in (AttributeError, KeyError, IndexError, LookupError, OverflowError, ZeroDivisionError,
                 NotImplementedError, RecursionError, AssertionError)}
