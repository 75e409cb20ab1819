"""The documented alternatives: where a backend may answer otherwise than the emulator, and why.

The reference model answers as the emulator does, except for exactly these cases on a backend with
the capability named: there it expects what ``accepted`` says instead (the model's code checks
``Alternative.id`` in its active set; nothing else differs). Every other difference between a backend
and the model is a bug in one of them. README's table of alternatives is ``markdown_table()``
(tests/pytest_san/test_model_alternatives.py keeps them in step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class Alternative:
    id: str
    capability: str  # the backend capability that selects it
    case: str
    emulator: str  # what the emulator answers
    accepted: str  # what the model accepts (expects) instead
    why: str


RC_QUEUE_ORDER = "rc-queue-order"
LOCAL_BREAK = "local-error-breaks-local-end"
LKEY_STATUS = "unknown-lkey-status"
SHORT_RECEIVE = "short-receive-status"
ZERO_RDMA = "zero-byte-rdma"
RNR_BOUNDED = "send-wait-bounded"

ALTERNATIVES: tuple[Alternative, ...] = (
    Alternative(RC_QUEUE_ORDER, "verbs",
                "an RDMA transfer posted while a send of the same socket waits for the peer's receive",
                "runs at once",
                "it waits behind the send and completes after it, in posting order",
                "an RC send queue executes and completes in order; the waiting send holds it (RNR retry)"),
    Alternative(RNR_BOUNDED, "verbs",
                "a send waiting for the peer's receive",
                "waits until the peer posts one, or the connection ends",
                "after about 2 s it may complete CONNECTION_RESET instead, its end going to error (the peer "
                "stays connected and learns it as below); when the peer closes about then, its end's other "
                "operations complete ABORTED or CONNECTION_RESET",
                "rxe (kernel 6.1) lets the retransmission timer run out during RNR retries, although rnr_retry is 7 "
                "(retry forever); a real NIC waits"),
    Alternative(LOCAL_BREAK, "verbs",
                "a transfer refused for its own local buffers (bad handle, access or bounds)",
                "both ends go to error; the peer's pending operations complete ABORTED",
                "only the local end goes to error; the peer stays connected until it next sends to it "
                "(then CONNECTION_RESET, after the transport's retries, about 2 s), and a send of the peer "
                "already waiting completes CONNECTION_RESET",
                "a requester's local error moves only its own QP to ERR: nothing reached the responder"),
    Alternative(LKEY_STATUS, "verbs",
                "a send or rdma_write source, posted on an idle send queue, whose handle is neither registered "
                "on the socket nor known to its process (foreign, stale, junk)",
                "LOCAL_PROTECTION",
                "LOCAL_PROTECTION or REMOTE_OPERATION",
                "the NIC checks an lkey the provider does not know; rxe reports LOC_QP_OP_ERR (REMOTE_OPERATION) "
                "where other NICs report LOC_PROT_ERR"),
    Alternative(SHORT_RECEIVE, "verbs",
                "a receive too small for the message",
                "LOCAL_LENGTH",
                "LOCAL_LENGTH or REMOTE_OPERATION",
                "rxe completes it LOC_QP_OP_ERR where the contract expects LOC_LEN_ERR"),
    Alternative(ZERO_RDMA, "verbs",
                "an RDMA transfer of zero bytes (an empty scatter list)",
                "checked against the window: SUCCESS, or ACCESS_VIOLATION breaking both ends",
                "SUCCESS at once whenever 0 <= offset <= the length the descriptor states (registered or not, "
                "any access), else ACCESS_VIOLATION breaking only the local end",
                "the IB spec lets a NIC skip the rkey check of a zero-length transfer and rxe never completes "
                "a zero-length RDMA READ: the verbs provider completes it itself"),
)

BY_ID = {alt.id: alt for alt in ALTERNATIVES}


def active(capabilities: Iterable[str]) -> frozenset[str]:
    """The ids of the alternatives a backend with ``capabilities`` may take."""
    caps = set(capabilities)
    return frozenset(alt.id for alt in ALTERNATIVES if alt.capability in caps)


def markdown_table() -> list[str]:
    """README's table of the alternatives, one line per row."""
    lines = ["| id | backend | case | the emulator | accepted | why |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| `{a.id}` | `{a.capability}` | {a.case} | {a.emulator} | {a.accepted} | {a.why} |"
              for a in ALTERNATIVES]
    return lines
