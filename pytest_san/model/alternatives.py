"""The documented alternatives: where a backend may answer otherwise than the emulator, and why.

The reference model answers as the emulator does, except for exactly these cases on a backend with
the capability named (or on every backend, where none is named): there it expects what ``accepted`` says
instead (the model's code checks ``Alternative.id`` in its active set; nothing else differs). Where
``accepted`` names a refusal at the call *or* the emulator's answer, either is accepted, call by call: a
call refused so changes nothing (CONTRACT.md section 4), and the model goes on from before it. Every
other difference between a backend and the model is a bug in one of them. The table of alternatives in
the docs (``docs/model.md``) is ``markdown_table()`` (tests/pytest_san/model/test_alternatives.py keeps
them in step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from ..deviations import Why
from ..spi.contract import Completion, Status

if TYPE_CHECKING:
    from .reference import Model
    from .state import Expect


class Race(Protocol):
    """An alternative in which the backend may end an operation on its own, racing the steps. The engine asks
    about each operation ``waiting`` lists once it is ``after`` seconds old (each question is a round trip):
    before every step, and again when a step's answer or checks disagree with the model. One that ``gave_up``
    moves the model on as ``ended`` says."""

    @property
    def after(self) -> float: ...

    def waiting(self, model: Model) -> list[tuple[int, int]]:
        """(socket, op) of each operation that may end on its own now."""

    def gave_up(self, completion: Completion) -> bool:
        """Whether the operation, found done, ended on its own (rather than by a step)."""

    def ended(self, model: Model, sock: int) -> Expect:
        """The model moved on as the backend did; what it expects of that."""


@dataclasses.dataclass(frozen=True)
class Alternative:
    id: str
    capability: str | None  # the backend capability that selects it (None: every backend)
    case: str
    emulator: str  # what the emulator answers
    accepted: str  # what the model accepts (expects) instead
    because: str  # why a backend answers so
    rule: str  # the rule it loosens (its row of docs/deviations.md's table)
    why: Why  # the kind of reason: by design, a kernel's bug, the spec's ambiguity
    reproducer: str | None = None  # the lab command that shows a kernel's behaviour (a kernel bug has one)
    unless: str | None = None  # a capability that deselects it (a backend with both answers as the emulator)
    race: Race | None = None  # what the backend may do on its own, between the steps

    def applies(self, capabilities: frozenset[str]) -> bool:
        selected = self.capability is None or self.capability in capabilities
        return selected and (self.unless is None or self.unless not in capabilities)

    @property
    def backend(self) -> str:
        """Which backends take it, as the docs' table says."""
        which = "any" if self.capability is None else f"`{self.capability}`"
        return which + (f" without `{self.unless}`" if self.unless else "")


RC_QUEUE_ORDER = "rc-queue-order"
LOCAL_BREAK = "local-error-breaks-local-end"
LKEY_STATUS = "unknown-lkey-status"
SHORT_RECEIVE = "short-receive-status"
ZERO_RDMA = "zero-byte-rdma"
RNR_BOUNDED = "send-wait-bounded"
READ_ONE_BUFFER = "rdma-read-one-buffer"
ERROR_ENDS_CONNECTION = "error-ends-connection"
STATED_FIRST = "descriptor-checked-first"
REFUSED_AT_CALL = "refused-at-the-call"



@dataclasses.dataclass(frozen=True)
class SendGivesUp:
    """send-wait-bounded's race (rxe): a send waiting for the peer's receive may end CONNECTION_RESET on its own,
    after about 2 s; younger than ``after`` seconds, it is not asked about."""

    after: float = 1.0

    def waiting(self, model: Model) -> list[tuple[int, int]]:
        return model.waiting_sends()

    def gave_up(self, completion: Completion) -> bool:
        # Done and not delivered: a send the step itself let complete (a receive the peer posted) did not give up.
        return completion.status != Status.SUCCESS

    def ended(self, model: Model, sock: int) -> Expect:
        return model.gave_up(sock)


ALTERNATIVES: tuple[Alternative, ...] = (
    Alternative(RC_QUEUE_ORDER, "verbs",
                "an RDMA transfer posted while a send of the same socket waits for the peer's receive",
                "runs at once",
                "it waits behind the send and completes after it, in posting order",
                "an RC send queue executes and completes in order; the waiting send holds it (RNR retry)",
                unless="iwarp",
                rule="R14", why="by-design"),
    Alternative(RNR_BOUNDED, "verbs",
                "a send waiting for the peer's receive",
                "waits until the peer posts one, or the connection ends",
                "after about 2 s it may complete CONNECTION_RESET instead, its end going to error (the peer "
                "stays connected and learns it as below); when the peer closes about then, its end's other "
                "operations complete ABORTED or CONNECTION_RESET",
                "rxe (kernel 6.1) lets the retransmission timer run out during RNR retries, although rnr_retry is 7 "
                "(retry forever); a real NIC waits", unless="iwarp",
                rule="R14", why="kernel-bug", reproducer="san-hil lab reproduce rxe-send-wait-bounded",
                race=SendGivesUp()),
    Alternative(LOCAL_BREAK, "verbs",
                "a transfer refused for its own local buffers (bad handle, access or bounds)",
                "both ends go to error; the peer's pending operations complete ABORTED",
                "only the local end goes to error; the peer stays connected until it next sends to it "
                "(then CONNECTION_RESET, after the transport's retries, about 2 s), and a send of the peer "
                "already waiting completes CONNECTION_RESET",
                "a requester's local error moves only its own QP to ERR: nothing reached the responder (on iWARP "
                "the QP's error ends the connection: error-ends-connection)", unless="iwarp",
                rule="R4", why="by-design"),
    Alternative(LKEY_STATUS, "verbs",
                "a send or rdma_write source, posted on an idle send queue, whose handle is neither registered "
                "on the socket nor known to its process (foreign, stale, junk)",
                "LOCAL_PROTECTION",
                "LOCAL_PROTECTION or REMOTE_OPERATION",
                "the NIC checks an lkey the provider does not know; rxe reports LOC_QP_OP_ERR (REMOTE_OPERATION) "
                "where other NICs report LOC_PROT_ERR",
                rule="R14", why="kernel-bug", reproducer="san-hil lab reproduce rxe-unknown-lkey-status"),
    Alternative(SHORT_RECEIVE, "verbs",
                "a receive too small for the message",
                "LOCAL_LENGTH",
                "LOCAL_LENGTH or REMOTE_OPERATION",
                "rxe completes it LOC_QP_OP_ERR where the contract expects LOC_LEN_ERR",
                rule="R14", why="kernel-bug", reproducer="san-hil lab reproduce rxe-short-receive-status"),
    Alternative(ZERO_RDMA, "verbs",
                "an RDMA transfer of zero bytes (an empty scatter list)",
                "checked against the window: SUCCESS, or ACCESS_VIOLATION breaking both ends",
                "SUCCESS at once whenever 0 <= offset <= the length the descriptor states (registered or not, "
                "any access), else ACCESS_VIOLATION breaking only the local end",
                "the IB spec lets a NIC skip the rkey check of a zero-length transfer, and rxe checks nothing "
                "of one (6.1 and 6.12): the verbs provider completes it itself",
                rule="R3", why="spec-ambiguity"),
    Alternative(READ_ONE_BUFFER, None,
                "an rdma_read whose scatter list has more than one non-empty entry (at most the contract's 4)",
                "reads into them all",
                "WSAEINVAL at the call (too many buffers), nothing posted; or, as the emulator, the read into them all "
                "(of a provider that declares reference_order: WSAEINVAL, its device check's answer)",
                "how many entries the device scatters an RDMA read into is its own (max_sge_rd 1: siw); a provider "
                "whose device reads into at least 4 declares rdma_read_scatter", unless="rdma_read_scatter",
                rule="R14", why="by-design"),
    Alternative(ERROR_ENDS_CONNECTION, "iwarp",
                "an error on either end of a connection: a transfer refused for its local buffers or by the "
                "responder (another connection's, a deregistered or too small window, the wrong access), a "
                "message into a receive too small",
                "both ends go to error; the failing operation completes with its own status (REMOTE_OPERATION for "
                "the send into a short receive), what else is pending on either end ABORTED",
                "both ends go to error; an operation the responder refused (a send into a short receive "
                "included) completes ACCESS_VIOLATION, ABORTED or CONNECTION_RESET, with 0 bytes; what else is "
                "pending on either end ABORTED or CONNECTION_RESET",
                "iWARP has no error completion for a requester: the responder terminates the stream (RFC 5040, "
                "5041) and a QP in error ends its connection, so both ends learn it from the connection's end, "
                "in either order; the verbs provider fences each write and send with a zero-length read to learn "
                "it at all",
                rule="R4", why="by-design"),
    Alternative(STATED_FIRST, "iwarp",
                "an RDMA transfer outside the range, or without the access, that its descriptor states, whose "
                "source holds a handle only the NIC can refuse (unknown-lkey-status)",
                "the NIC's answer to the source's handle",
                "ACCESS_VIOLATION: refused before it is posted, and the connection ends (error-ends-connection)",
                "siw checks a write's bounds segment by segment and serves a read from an MR without REMOTE_READ, "
                "so the verbs provider checks the range and access an iWARP descriptor states before posting",
                rule="R14", why="kernel-bug", reproducer="san-hil lab reproduce siw-unchecked-remote-access"),
    Alternative(REFUSED_AT_CALL, None,
                "a transfer with a scatter list entry its provider refuses (a handle unknown on the socket, "
                "another socket's or deregistered; a range outside the handle's registration; a handle without "
                "the access the use needs)",
                "an error completion (LOCAL_PROTECTION, or what unknown-lkey-status allows), and the connection "
                "goes to error",
                "WSAEFAULT or WSAEINVAL at the call, changing nothing (no byte, state, in-use mark); or, as the "
                "emulator, the error completion",
                "CONTRACT.md section 2: rejected is a SanError at the call or an error completion, no byte moving "
                "either way; a provider that keeps its own table of what each handle allows may check it before "
                "it posts (section 4: bad buffers are WSAEFAULT or WSAEINVAL at the call)",
                rule="R14", why="spec-ambiguity"),
)

BY_ID = {alt.id: alt for alt in ALTERNATIVES}


def active(capabilities: Iterable[str]) -> frozenset[str]:
    """The ids of the alternatives a backend with ``capabilities`` may take."""
    caps = frozenset(capabilities)
    return frozenset(alt.id for alt in ALTERNATIVES if alt.applies(caps))


def races(ids: Iterable[str]) -> list[Race]:
    """The races of the alternatives ``ids`` (a backend's active set)."""
    chosen = set(ids)
    return [alt.race for alt in ALTERNATIVES if alt.id in chosen and alt.race is not None]


def markdown_table() -> list[str]:
    """The docs' table of the alternatives (``docs/model.md``), one line per row."""
    lines = ["| id | backend | case | the emulator | accepted | why |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| `{a.id}` | {a.backend} | {a.case} | {a.emulator} | {a.accepted} | {a.because} |"
              for a in ALTERNATIVES]
    return lines
