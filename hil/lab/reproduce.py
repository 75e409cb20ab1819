"""``san-hil lab reproduce NAME``: a kernel bug the verbs engine works around, shown on a lab with the workaround off.

Each reproducer runs inside a guest (the guests share this machine's filesystem, so this very module runs
there with the project's interpreter): the real verbs engine, its children started with
``SAN_VERBS_WORKAROUNDS=none`` (hil/agent/engines/verbs/quirks.py), does what the workaround avoids, and says
whether the kernel still has the bug (exit 1), no longer has it (exit 0) or could not tell (exit 2), with the
kernel's release and the end of its log. A bug like siw's NULL dereference can leave the guest's device hung:
reproduce on a lab you tear down afterwards.

    san-hil lab up --provider siw --kernel 6.12 --state-dir /tmp/repro
    san-hil lab reproduce siw-zero-length-sge --state-dir /tmp/repro
    san-hil lab down --state-dir /tmp/repro
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hil.lab import reproduce_rsockets

__all__ = ["REPRODUCERS", "main", "remote_command", "worst"]

WAIT = 30.0  # seconds a transfer gets to complete (TCG guests are slow; a working one takes well under 1 s)
DMESG_LINES = 30


def _engine() -> Any:
    from hil.agent.engines.verbs.engine import VerbsEngine

    os.environ["SAN_VERBS_WORKAROUNDS"] = "none"  # the children read it when they start
    return VerbsEngine("reproduce", device=os.environ.get("SAN_DEVICE"), netdev=os.environ.get("SAN_NETDEV"))


def _dmesg(lines: int = DMESG_LINES) -> str:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(dmesg: {exc})"
    return "\n".join(out.splitlines()[-lines:])


def _pair(engine: Any) -> tuple[Any, Any, Any, Any]:
    a, b = engine.default_process, engine.spawn(spare=False)
    sa, sb = engine.connect_local(a, b)
    return a, b, sa, sb


def _wait(operation: Any, seconds: float = WAIT) -> dict[str, Any] | None:
    try:
        done: dict[str, Any] = operation.wait(seconds)
    except TimeoutError:
        return None
    return done


def _off(engine: Any, name: str) -> dict[str, Any] | None:
    """Why the reproducer cannot run: its workaround is still applied (SAN_VERBS_WORKAROUNDS did not reach it)."""
    if name in engine.hello().get("workarounds", []):
        return {"verdict": "inconclusive", "detail": f"the workaround {name} is still applied"}
    return None


def siw_zero_length_sge(engine: Any) -> dict[str, Any]:
    """A send whose scatter list starts with a zero-length entry, then 64 bytes: siw_tx_hdt (kernel 6.1) takes
    the zero-length entry's memory object, which siw never looked up (NULL), and oopses."""
    from pytest_san.spi.contract import Access, Status

    if (refused := _off(engine, "siw-zero-length-sge")) is not None:
        return refused
    provider = engine.provider
    a, b, sa, sb = _pair(engine)
    src, dst = a.alloc(4096), b.alloc(4096)
    a.write(src.address, bytes(range(64)))
    h = provider.register_memory(sa, src, Access.READ)
    hd = provider.register_memory(sb, dst, Access.READWRITE)
    recv = provider.recv(sb, [(dst, hd)])
    empty = engine.resolve_buffer(a, src.address, 0)
    first = engine.resolve_buffer(a, src.address, 64)
    done = _wait(provider.send(sa, [(empty, h), (first, h)]))
    if done is None:
        return {"verdict": "still there", "detail": f"the send did not complete within {WAIT:g} s"}
    got = _wait(recv)
    moved = b.read(dst.address, 64) == bytes(range(64))
    if done["status"] == Status.SUCCESS.value and done["bytes"] == 64 and moved:
        return {"verdict": "gone", "detail": f"the send completed SUCCESS, 64 bytes; the receive {got}"}
    return {"verdict": "inconclusive", "detail": f"the send completed {done}, the receive {got}, bytes moved: {moved}"}


def _read_of_a_write_only_window(engine: Any) -> tuple[str, str]:
    """An RDMA read of a window registered WRITE-only: served (the bug), or refused."""
    from pytest_san.spi.contract import Access, Status

    provider = engine.provider
    a, b, sa, sb = _pair(engine)
    sink, far = a.alloc(4096), b.alloc(4096)
    b.write(far.address, b"\x5a" * 4096)
    h = provider.register_memory(sa, sink, Access.READWRITE)
    descriptor = provider.register_rdma_memory(sb, far, Access.WRITE)
    done = _wait(provider.rdma_read(sa, [(sink, h)], descriptor, 0))
    leaked = a.read(sink.address, 4096) == b"\x5a" * 4096
    if done is not None and done["status"] == Status.SUCCESS.value and leaked:
        return "still there", "the read of a WRITE-only window completed SUCCESS, 4096 bytes read (R7)"
    if done is not None and done["status"] != Status.SUCCESS.value and not leaked:
        return "gone", f"the responder refused the read of a WRITE-only window: {done}"
    return "inconclusive", f"the read of a WRITE-only window: {done}, its bytes read: {leaked}"


OVERLONG = 256 * 1024  # an RDMA write of twice the window: at least three FPDUs (each at most 64 KiB), whatever the MSS


def _overlong_write(engine: Any) -> tuple[str, str]:
    """An RDMA write twice as long as its window: refused whole (gone), or its first segments placed."""
    from pytest_san.spi.contract import Access, Status

    provider = engine.provider
    a, b, sa, sb = _pair(engine)
    src, far = a.alloc(OVERLONG), b.alloc(OVERLONG)
    a.write(src.address, b"\xa5" * OVERLONG)
    b.write(far.address, bytes(OVERLONG))
    h = provider.register_memory(sa, src, Access.READ)
    descriptor = provider.register_rdma_memory(sb, engine.resolve_buffer(b, far.address, OVERLONG // 2), Access.WRITE)
    done = _wait(provider.rdma_write(sa, [(src, h)], descriptor, 0))
    landed = b.read(far.address, OVERLONG)
    inside, beyond = OVERLONG // 2 - landed[:OVERLONG // 2].count(0), OVERLONG // 2 - landed[OVERLONG // 2:].count(0)
    what = (f"an RDMA write of {OVERLONG} bytes into a window of {OVERLONG // 2} completed {done}; bytes placed "
            f"in the window: {inside}, past it: {beyond}")
    if done is not None and done["status"] != Status.SUCCESS.value:
        return ("still there" if inside else "gone"), what
    return ("still there" if done is not None else "inconclusive"), what


def siw_unchecked_remote_access(engine: Any) -> dict[str, Any]:
    """Both halves of the bug, the initiator's own check off, each on a connection of its own: an RDMA read
    of a window registered WRITE-only (siw answers it with perms 0: siw_qp_sq_proc's READ_RESPONSE, kernel 6.1
    and 6.12), and an RDMA write twice as long as its window (siw_proc_write checks each DDP segment alone and
    places those inside). Still there if either is."""
    if (refused := _off(engine, "siw-unchecked-remote-access")) is not None:
        return refused
    (read, why_read), (write, why_write) = _read_of_a_write_only_window(engine), _overlong_write(engine)
    return {"verdict": worst(read, write), "detail": f"read: {read}: {why_read}; write: {write}: {why_write}"}


def worst(*verdicts: str) -> str:
    """A bug of several parts: still there if one part is, gone once every part is, else inconclusive."""
    if "still there" in verdicts:
        return "still there"
    return "gone" if verdicts and set(verdicts) == {"gone"} else "inconclusive"


def rxe_zero_length_read(engine: Any) -> dict[str, Any]:
    """An RDMA read of zero bytes posted to the NIC (the engine completes it itself otherwise): it never
    completed, as the lab fuzz once saw it on rxe; it does complete on 6.1 and 6.12. The detail also shows why
    the engine keeps completing one itself (quirks.py's ``kept``): one past the window's end completes too."""
    from pytest_san.spi.contract import Access

    if (refused := _off(engine, "rxe-zero-length-read")) is not None:
        return refused
    provider = engine.provider
    a, b, sa, sb = _pair(engine)
    sink, far = a.alloc(4096), b.alloc(4096)
    h = provider.register_memory(sa, sink, Access.READWRITE)
    descriptor = provider.register_rdma_memory(sb, far, Access.READ)
    done = _wait(provider.rdma_read(sa, [(engine.resolve_buffer(a, sink.address, 0), h)], descriptor, 0), 15.0)
    if done is None:
        return {"verdict": "still there", "detail": "the zero-byte RDMA read did not complete within 15 s"}
    # Why the engine keeps completing them itself (quirks.py): the NIC checks no range for zero bytes.
    past = _wait(provider.rdma_read(sa, [(engine.resolve_buffer(a, sink.address, 0), h)], descriptor, 8192), 15.0)
    return {"verdict": "gone", "detail": f"the zero-byte RDMA read completed: {done}; one at offset 8192 of the "
                                         f"4096-byte window: {past}"}


def rxe_send_wait_bounded(engine: Any) -> dict[str, Any]:
    """A send the peer has posted no receive for (the model's send-wait-bounded): with rnr_retry 7 (retry for
    ever) it should wait; rxe (kernel 6.1) lets the retransmission timer end it after about 2 s."""
    from pytest_san.spi.contract import Access

    provider = engine.provider
    a, b, sa, sb = _pair(engine)
    src, dst = a.alloc(4096), b.alloc(4096)
    h = provider.register_memory(sa, src, Access.READ)
    hd = provider.register_memory(sb, dst, Access.READWRITE)
    send = provider.send(sa, [(engine.resolve_buffer(a, src.address, 64), h)])
    started = time.monotonic()
    done = _wait(send, 10.0)
    if done is not None:
        return {"verdict": "still there", "detail": f"the waiting send ended after {time.monotonic() - started:.1f} "
                                                    f"s: {done}"}
    provider.recv(sb, [(dst, hd)])
    return {"verdict": "gone", "detail": f"the send waited 10 s, then completed with the receive: {_wait(send)}"}


def _unknown_lkey_send(engine: Any) -> dict[str, Any] | None:
    """A send whose source names an lkey nobody registered, on an idle queue: its completion, or None."""
    from pytest_san.spi.contract import Access

    provider = engine.provider
    a, b, sa, sb = _pair(engine)
    src, dst = a.alloc(4096), b.alloc(4096)
    provider.recv(sb, [(dst, provider.register_memory(sb, dst, Access.READWRITE))])
    return _wait(provider.send(sa, [(engine.resolve_buffer(a, src.address, 64), 0x7FF0F0)]))


def rxe_flushed_local_error(engine: Any) -> dict[str, Any]:
    """A send whose source names an lkey nobody registered, posted to the NIC (the engine refuses it itself
    otherwise): rxe (kernel 6.12) flushes it, WR_FLUSH_ERR (5), instead of completing it with its error."""
    if (refused := _off(engine, "rxe-flushed-local-error")) is not None:
        return refused
    done = _unknown_lkey_send(engine)
    wc = -1 if done is None else done.get("wc_status", -1)
    if wc == 5:
        return {"verdict": "still there", "detail": f"the send completed WR_FLUSH_ERR, nothing else failed: {done}"}
    if wc in (2, 4):
        return {"verdict": "gone", "detail": f"the send completed with its error (wc_status {wc}): {done}"}
    return {"verdict": "inconclusive", "detail": f"the send completed {done}"}


def rxe_unknown_lkey_status(engine: Any) -> dict[str, Any]:
    """The same send (the model's unknown-lkey-status): verbs says LOC_PROT_ERR (4); rxe (kernel 6.1)
    completes it LOC_QP_OP_ERR (2)."""
    done = _unknown_lkey_send(engine)
    wc = -1 if done is None else done.get("wc_status", -1)
    verdict = {2: "still there", 4: "gone"}.get(wc, "inconclusive")
    why = (": cannot tell, the kernel flushed the request (rxe-flushed-local-error), so the status it gives a "
           "bad lkey is never seen") if wc == 5 else ""
    return {"verdict": verdict, "detail": f"the send completed {done} (wc_status {wc}){why}"}


def rxe_short_receive_status(engine: Any) -> dict[str, Any]:
    """A 64-byte message into a 16-byte receive (the model's short-receive-status): verbs says LOC_LEN_ERR (1)
    at the receiver; rxe (kernel 6.1) says LOC_QP_OP_ERR (2)."""
    from pytest_san.spi.contract import Access

    provider = engine.provider
    a, b, sa, sb = _pair(engine)
    src, dst = a.alloc(4096), b.alloc(4096)
    recv = provider.recv(sb, [(engine.resolve_buffer(b, dst.address, 16),
                               provider.register_memory(sb, dst, Access.READWRITE))])
    send = provider.send(sa, [(engine.resolve_buffer(a, src.address, 64),
                               provider.register_memory(sa, src, Access.READ))])
    got, sent = _wait(recv), _wait(send)
    wc = -1 if got is None else got.get("wc_status", -1)
    verdict = {2: "still there", 1: "gone"}.get(wc, "inconclusive")
    return {"verdict": verdict, "detail": f"the receive completed {got} (wc_status {wc}), the send {sent}"}


def rxe_local_op_replayed(engine: Any) -> dict[str, Any]:
    """A window bound behind a send the peer has posted no receive for yet, then the receive: rxe 6.12
    replays the bind with the send's RNR retry, the second bind fails, and the QP goes to error with the
    send flushed (WR_FLUSH_ERR) instead of completing; on rxe 6.1 the send never completes at all."""
    from pytest_san.spi.contract import Access, SanError, Status

    if (refused := _off(engine, "rxe-local-op-replayed")) is not None:
        return refused
    provider = engine.provider
    a, b, sa, sb = _pair(engine)
    src, far, dst = a.alloc(4096), a.alloc(4096), b.alloc(4096)
    h = provider.register_memory(sa, src, Access.READ)
    hd = provider.register_memory(sb, dst, Access.READWRITE)
    send = provider.send(sa, [(engine.resolve_buffer(a, src.address, 64), h)])  # waits: no receive yet
    try:
        provider.register_rdma_memory(sa, far, Access.WRITE)  # the bind, behind the waiting send
    except SanError as exc:
        return {"verdict": "still there", "detail": f"the bind behind the waiting send failed: {exc}"}
    time.sleep(1.0)  # the send is retried meanwhile
    provider.recv(sb, [(dst, hd)])
    done = _wait(send)
    if done is None:
        return {"verdict": "still there", "detail": f"the send did not complete within {WAIT:g} s of the receive "
                                                    "(nor did its retries run out)"}
    if done["status"] == Status.SUCCESS.value and done["bytes"] == 64:
        return {"verdict": "gone", "detail": f"the send completed once the receive came: {done}"}
    return {"verdict": "still there", "detail": f"the send behind which the window was bound completed {done}"}


# Each is a workaround of hil/agent/engines/verbs/quirks.py (run with it off), or a kernel behaviour one of the
# model's documented alternatives accepts (pytest_san/model/alternatives.py), observed as the engine is.
REPRODUCERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "siw-zero-length-sge": siw_zero_length_sge,
    "siw-unchecked-remote-access": siw_unchecked_remote_access,
    "rxe-zero-length-read": rxe_zero_length_read,
    "rxe-send-wait-bounded": rxe_send_wait_bounded,
    "rxe-flushed-local-error": rxe_flushed_local_error,
    "rxe-local-op-replayed": rxe_local_op_replayed,
    "rxe-unknown-lkey-status": rxe_unknown_lkey_status,
    "rxe-short-receive-status": rxe_short_receive_status,
    "rsockets-rclose-live-riomap": reproduce_rsockets.rsockets_rclose_live_riomap,
}
_EXIT = {"gone": 0, "still there": 1, "inconclusive": 2}


# A reproducer whose bug oopses the kernel: the function the oops names. Its process may die in the system
# call, or hang; the kernel's log decides.
OOPS = {"siw-zero-length-sge": "siw_tx_hdt"}


def _oops(before: str, after: str, function: str) -> str | None:
    """The first line of a new oops in ``function``, if the kernel's log grew one."""
    new = after.splitlines()[len(before.splitlines()):] if after.startswith(before[:200]) else after.splitlines()
    text = "\n".join(new)
    if function in text and ("BUG:" in text or "Oops" in text):
        return next(line for line in new if "BUG:" in line or "Oops" in line).strip()
    return None


def run(name: str) -> tuple[dict[str, Any], Any]:
    """Reproduce ``name`` here (in a guest): the verdict, with the kernel's release and log; and the engine,
    still to be closed (or not: after an oops its processes may hang in the kernel)."""
    started = time.monotonic()
    result: dict[str, Any] = {"name": name, "kernel": os.uname().release}
    before = _dmesg(10**6)
    engine = None
    try:
        engine = _engine()
        result.update(REPRODUCERS[name](engine))
    except Exception as exc:  # no device here, or the device itself failed (an oops killed a process)
        result.update(verdict="inconclusive", detail=f"{type(exc).__name__}: {exc}")
    after = _dmesg(10**6)
    oops = _oops(before, after, OOPS[name]) if name in OOPS else None
    if oops is not None:
        result.update(verdict="still there", detail=f"{result.get('detail')}; the kernel: {oops}")
    result["dmesg"] = "\n".join(after.splitlines()[-DMESG_LINES:])
    result["seconds"] = round(time.monotonic() - started, 1)
    return result, engine


GUEST_PYTHON = "python3"  # the guest's system interpreter, which has pyverbs (the agent runs with it too)


def remote_command(name: str) -> list[str]:
    """What ``san-hil lab reproduce`` runs in the guest: this module, from this project (the guests share this
    machine's filesystem), with the guest's python3: the engine's children need its pyverbs."""
    root = Path(__file__).resolve().parents[2]
    return ["cd", str(root), "&&", GUEST_PYTHON, "-m", "hil.lab.reproduce", name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hil.lab.reproduce", allow_abbrev=False,
                                     description="reproduce a kernel bug in this guest, its workaround off")
    parser.add_argument("name", choices=sorted(REPRODUCERS))
    args = parser.parse_args(argv)
    result, engine = run(args.name)
    print(json.dumps(result, indent=2), flush=True)
    status = _EXIT.get(result.get("verdict", ""), 2)
    if engine is not None:
        if result.get("verdict") == "still there":
            os._exit(status)  # its processes may hang in the kernel for good: leave them to the lab's teardown
        engine.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
