"""A rogue NVMe-oF target: it listens where nvmet would (port 4420), accepts the kernel host's admin queue, and
tries what the host's advertised keys allow instead of answering as a target should.

    python3 nvme_rogue.py --device rxe0 [--address 10.77.0.1]

Run by the agent as a child under observation (``hil.agent.observe.driver``, program ``nvme-rogue``), one JSON
line at a time (``hil.agent.observe.serve``). Calls:

* ``listen(port=4420)``: bind and listen on the device's address; ``{"address", "port"}``.
* ``serve(probe, deadline=90)`` (in the background, while the host connects): accept the next admin queue
  connection, receive the Fabrics Connect command, read what its keyed SGL advertises (the host's 1024 bytes of
  Connect data: the NQNs in it prove it), then one probe:

  - ``outside``: read bytes next to the advertised range, *inside the same page* (never an address nothing maps),
    then answer Connect with an error;
  - ``stale``: answer Connect with success, wait for the host's next command (proof that the Connect request is
    over, and that a host which registers per request has invalidated its key), read the advertised range again
    with the old key, then answer that command with an error;
  - ``write``: write the bytes just read back into the buffer the host sends Connect data from (a target may
    only read it), then answer Connect with an error;
  - ``read``: answer as a target until the host sends Identify, whose buffer the target may only write; read it,
    then answer Identify with an error.

  The answer names what the host advertised, what each RDMA operation returned (its completion status) and the
  bytes read. A read that completes with an error status is *refused*; the queue pair is dead after it.

Nothing is left once ``serve`` returns: the connection is closed and its QP destroyed. Python 3.9+, pyverbs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import struct
import sys
import time
from typing import Any

if __package__ in (None, ""):  # run as a script by the agent: its tree is importable from four levels up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))))

from hil.agent.nvme import wire
from hil.agent.observe.serve import CallFailed, Server, own_stdout

METHODS = ("listen", "serve")
PROBES = ("outside", "stale", "write", "read")
SLOT = 4096  # bytes per receive buffer (a capsule: SQE and any in-capsule data)
RECV_SLOTS = 16
QUEUE_SIZE = 32  # what the rogue tells the host its receive queue holds (crqsize)
IDENTIFY = 0x06
WC_STATUS = {0: "success", 4: "local protection error", 5: "flushed", 9: "remote invalid request",
             10: "remote access error", 11: "remote operation error", 12: "transport retry exceeded",
             13: "RNR retry exceeded", 21: "general error"}
"""ibv_wc_status values (verbs.h) by the words a reader wants."""


def status_name(status: int) -> str:
    return WC_STATUS.get(status, f"status {status}")


class Connection:
    """One accepted admin queue: its CMID, QP, receive and send buffers, and completions set aside."""

    def __init__(self, rogue: Rogue, cmid: Any, qp: Any) -> None:
        self.rogue, self.cmid, self.qp = rogue, cmid, qp
        self.pending: list[Any] = []  # completions polled while waiting for another one
        self.qp_num = int(qp.qp_num)
        self.next_wr = 1000
        self.dead = False


class Rogue:
    def __init__(self, device: str, address: str | None) -> None:
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD

        from hil.agent.engines.verbs import enums as e
        from hil.agent.engines.verbs.connections import new_channel
        from hil.agent.engines.verbs.context import _node_type
        from hil.agent.engines.verbs.devices import device_address

        self.e = e
        self.device = device
        self.address = address or device_address(device, 1)[1]
        self.iwarp = _node_type(device).startswith("4")
        self.ctx = Context(name=device)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 128)
        access = e.IBV_ACCESS_LOCAL_WRITE
        self.recv_mr = MR(self.pd, SLOT * RECV_SLOTS, access)
        self.send_mr = MR(self.pd, SLOT, access)
        self.data_mr = MR(self.pd, 2 * wire.PAGE, access)  # the sink of reads and the source of writes
        self.channel, self.channel_fd = new_channel()
        self.listener: Any = None

    # -- the connection manager ------------------------------------------------------------------

    def listen(self, port: int = 4420) -> dict[str, Any]:
        from pyverbs.cmid import CMID, AddrInfo

        e = self.e
        listener = CMID(creator=self.channel, port_space=e.RDMA_PS_TCP)
        try:
            listener.bind_addr(AddrInfo(src=self.address, src_service=str(port), port_space=e.RDMA_PS_TCP,
                                        flags=e.RAI_PASSIVE))
            listener.listen(8)
        except Exception as exc:
            listener.close()
            raise CallFailed("listen", getattr(exc, "error_code", 0) or 0,
                             f"listen on {self.address}:{port}: {exc}") from None
        if listener.dev_name != self.device:
            listener.close()
            raise CallFailed("listen", 0, f"the connection manager bound {self.address} to {listener.dev_name}, "
                                          f"not {self.device}")
        self.listener = listener
        return {"address": self.address, "port": port}

    def _event(self, until: float, wanted: tuple[int, ...]) -> tuple[int, Any, bytes]:
        """The next CM event of a kind in ``wanted`` (others are acknowledged and dropped; a further connect
        request is rejected): (kind, the request's new CMID or None, private data)."""
        from pyverbs.cmid import CMID, CMEvent

        e = self.e
        while True:
            left = until - time.monotonic()
            if left <= 0:
                raise CallFailed("serve", 0, "no connection manager event in time (waiting for "
                                             f"{', '.join(map(str, wanted))})")
            ready, _, _ = select.select([self.channel_fd], [], [], min(left, 0.5))
            if not ready:
                continue
            event = CMEvent(self.channel)
            kind = int(event.event_type)
            private = b""
            request = None
            try:
                if kind == e.RDMA_CM_EVENT_CONNECT_REQUEST:
                    with contextlib.suppress(Exception):
                        private = bytes(event.private_data or b"")
                    request = CMID(creator=event, listen_id=self.listener)
            finally:
                with contextlib.suppress(Exception):
                    event.ack_cm_event()  # before anything else: destroying a CMID waits for its events' acks
            if kind in wanted:
                return kind, request, private
            if request is not None:
                with contextlib.suppress(Exception):
                    request.reject()
                request.close()

    def _accept(self, until: float) -> tuple[Connection, dict[str, int]]:
        """The next admin queue (qid 0) connection, accepted and established; other queues are rejected."""
        from pyverbs.cmid import ConnParam
        from pyverbs.qp import QP, QPCap, QPInitAttr

        e = self.e
        while True:
            _, request, private = self._event(until, (e.RDMA_CM_EVENT_CONNECT_REQUEST,))
            asked = wire.cm_request(private)
            if asked.get("qid", 0) == 0:
                break
            with contextlib.suppress(Exception):
                request.reject()
            request.close()
        cap = QPCap(max_send_wr=16, max_recv_wr=RECV_SLOTS, max_send_sge=1, max_recv_sge=1)
        qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0))
        conn = Connection(self, request, qp)
        try:
            self._qp_to(conn, e.IBV_QPS_INIT)
            for slot in range(RECV_SLOTS):
                self._post_recv(conn, slot)
            if not self.iwarp:  # iWARP: the kernel moves the QP to RTS when the connection is up
                self._qp_to(conn, e.IBV_QPS_RTR)
                self._qp_to(conn, e.IBV_QPS_RTS)
            param = ConnParam(resources=1, depth=4, retry=6, rnr_retry=7, qp_num=int(qp.qp_num))
            param.set_private_data(wire.cm_accept(QUEUE_SIZE))
            request.accept(param)
            self._event(until, (e.RDMA_CM_EVENT_ESTABLISHED,))
        except Exception:
            self._close(conn)
            raise
        return conn, asked

    def _qp_to(self, conn: Connection, state: int) -> None:
        e = self.e
        attr, mask = conn.cmid.init_qp_attr(state)
        if state == e.IBV_QPS_INIT:
            attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE
            mask |= e.IBV_QP_ACCESS_FLAGS
        conn.qp.modify(attr, mask)

    def _close(self, conn: Connection) -> None:
        with contextlib.suppress(Exception):
            conn.cmid.disconnect()
        with contextlib.suppress(Exception):
            conn.qp.close()
        with contextlib.suppress(Exception):
            conn.cmid.close()

    # -- verbs -----------------------------------------------------------------------------------

    def _post_recv(self, conn: Connection, slot: int) -> None:
        from pyverbs.wr import SGE, RecvWR

        sge = SGE(self.recv_mr.buf + slot * SLOT, SLOT, self.recv_mr.lkey)
        conn.qp.post_recv(RecvWR(wr_id=slot, num_sge=1, sg=[sge]))

    def _wait(self, conn: Connection, wr_id: int | None, until: float) -> Any:
        """The completion of ``wr_id`` (None: the next receive), set aside others meanwhile."""
        def match(wc: Any) -> bool:
            return int(wc.wr_id) == wr_id if wr_id is not None else int(wc.wr_id) < RECV_SLOTS
        while True:
            for wc in conn.pending:
                if match(wc):
                    conn.pending.remove(wc)
                    return wc
            n, wcs = self.cq.poll(8)
            if n:  # the CQ is shared: an earlier connection's flushed work requests are dropped
                conn.pending.extend(wc for wc in wcs[:n] if int(wc.qp_num) == conn.qp_num)
                continue
            if time.monotonic() >= until:
                what = f"work request {wr_id}" if wr_id is not None else "a command capsule"
                raise CallFailed("serve", 0, f"no completion of {what} in time")
            time.sleep(0.002)

    def _command(self, conn: Connection, until: float) -> wire.Command:
        wc = self._wait(conn, None, until)
        slot = int(wc.wr_id)
        if int(wc.status) != 0:
            conn.dead = True
            raise CallFailed("serve", 0, f"receiving a command failed: {status_name(int(wc.status))}")
        data = self.recv_mr.read(int(wc.byte_len), slot * SLOT)
        self._post_recv(conn, slot)
        return wire.parse_command(bytes(data))

    def _send(self, conn: Connection, capsule: bytes, until: float) -> str:
        from pyverbs.wr import SGE, SendWR

        e = self.e
        self.send_mr.write(capsule, len(capsule))
        conn.next_wr += 1
        wr = SendWR(wr_id=conn.next_wr, opcode=e.IBV_WR_SEND, num_sge=1,
                    sg=[SGE(self.send_mr.buf, len(capsule), self.send_mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        conn.qp.post_send(wr)
        return status_name(int(self._wait(conn, conn.next_wr, until).status))

    def _rdma(self, conn: Connection, write: bool, address: int, length: int, key: int, until: float,
              data: bytes = b"") -> dict[str, Any]:
        """One RDMA read (or write of ``data``) of the host's memory: {"address", "length", "key", "status",
        "refused", "bytes" (hex, a read that completed)}."""
        from pyverbs.wr import SGE, SendWR

        e = self.e
        record: dict[str, Any] = {"address": address, "length": length, "key": key}
        if conn.dead:
            return {**record, "status": "not tried: the queue pair is dead", "refused": None}
        if write:
            self.data_mr.write(data, len(data))
        conn.next_wr += 1
        wr = SendWR(wr_id=conn.next_wr, opcode=e.IBV_WR_RDMA_WRITE if write else e.IBV_WR_RDMA_READ, num_sge=1,
                    sg=[SGE(self.data_mr.buf, length, self.data_mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(key, address)
        conn.qp.post_send(wr)
        status = int(self._wait(conn, conn.next_wr, until).status)
        record.update(status=status_name(status), refused=status != 0)
        if status != 0:
            conn.dead = True
        elif not write:
            record["bytes"] = bytes(self.data_mr.read(length, 0)).hex()
        return record

    @staticmethod
    def _brief(read: dict[str, Any], keep: int = 64) -> dict[str, Any]:
        """A read's record with its first ``keep`` bytes (the whole of them in ``data``, for the caller)."""
        hexed = read.get("bytes", "")
        return {**read, "bytes": hexed[:2 * keep]} if len(hexed) > 2 * keep else read

    # -- the probes ------------------------------------------------------------------------------

    def serve(self, probe: str, deadline: float = 90.0) -> dict[str, Any]:
        if probe not in PROBES:
            raise ValueError(f"no probe {probe!r} (there is: {', '.join(PROBES)})")
        if self.listener is None:
            raise CallFailed("serve", 0, "not listening: call listen first")
        until = time.monotonic() + deadline
        conn, asked = self._accept(until)
        found: dict[str, Any] = {"probe": probe, "queue": asked}
        try:
            self._probe(conn, probe, until, found)
        finally:
            self._close(conn)
        return found

    def _probe(self, conn: Connection, probe: str, until: float, found: dict[str, Any]) -> None:
        connect = self._command(conn, until)
        found["command"] = connect.name
        sgl = connect.sgl
        if connect.fctype != wire.CONNECT or sgl is None:
            found["advertised"] = None
            self._send(conn, wire.completion(connect.command_id, wire.SC_INVALID_FIELD | wire.STATUS_DNR), until)
            return
        found["advertised"] = sgl.describe()
        read = self._rdma(conn, False, sgl.address, sgl.length, sgl.key, until)
        original = bytes.fromhex(read.get("bytes", ""))
        found["read"] = {**self._brief(read), "strings": wire.connect_strings(original)}
        refuse = wire.completion(connect.command_id, wire.SC_INTERNAL | wire.STATUS_DNR)
        if probe == "outside":
            address, length, where = wire.outside(sgl.address, sgl.length)
            found["outside"] = {**self._rdma(conn, False, address, length, sgl.key, until), "where": where}
        elif probe == "write":
            if original:  # the same bytes back: a write that lands changes nothing the host would notice
                found["write"] = self._rdma(conn, True, sgl.address, len(original), sgl.key, until, original)
        elif probe == "stale":
            found["answer"] = self._send(conn, wire.completion(connect.command_id, 0, result=1), until)
            after = self._command(conn, until)
            found["next_command"] = after.name
            found["stale"] = self._brief(self._rdma(conn, False, sgl.address, sgl.length, sgl.key, until))
            refuse = wire.completion(after.command_id, wire.SC_INTERNAL | wire.STATUS_DNR)
        elif probe == "read":
            found["answer"] = self._send(conn, wire.completion(connect.command_id, 0, result=1), until)
            refuse = self._until_identify(conn, until, found)
        if not conn.dead:
            found["refusal"] = self._send(conn, refuse, until)

    def _until_identify(self, conn: Connection, until: float, found: dict[str, Any]) -> bytes:
        """Answer property reads and writes as an idle controller until Identify comes; read its buffer."""
        registers = {0x00: wire.CAP_VALUE, 0x08: 0x00010400, 0x14: 0, 0x1C: 0}  # CAP, VS 1.4, CC, CSTS
        seen: list[str] = []
        for _ in range(32):
            command = self._command(conn, until)
            seen.append(command.name)
            if command.opcode == IDENTIFY and command.sgl is not None:
                found["identify"] = command.sgl.describe()
                found["commands"] = seen
                sgl = command.sgl
                found["read_identify"] = self._brief(self._rdma(conn, False, sgl.address, min(sgl.length, 256),
                                                                sgl.key, until))
                return wire.completion(command.command_id, wire.SC_INTERNAL | wire.STATUS_DNR)
            offset = struct.unpack_from("<I", command.raw, 44)[0]
            if command.fctype == wire.PROPERTY_GET:
                self._send(conn, wire.completion(command.command_id, 0, result=registers.get(offset, 0)), until)
            elif command.fctype == wire.PROPERTY_SET:
                value = struct.unpack_from("<Q", command.raw, 48)[0]
                registers[offset] = value
                if offset == 0x14:  # CC: CSTS.RDY follows CC.EN, and a shutdown request completes at once
                    registers[0x1C] = (value & 1) | ((2 << 2) if (value >> 14) & 3 else 0)
                self._send(conn, wire.completion(command.command_id), until)
            else:
                found["commands"] = seen
                return wire.completion(command.command_id, wire.SC_INVALID_FIELD | wire.STATUS_DNR)
        found["commands"] = seen
        raise CallFailed("serve", 0, f"no Identify after {len(seen)} commands: {', '.join(seen)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest-san-nvme-rogue")
    parser.add_argument("--device", default=os.environ.get("SAN_DEVICE"), help="the RDMA device (rxe0, siw0)")
    parser.add_argument("--address", help="the IPv4 address to listen on (default: the device's)")
    args = parser.parse_args(argv)
    server = Server(None, METHODS, own_stdout())
    try:
        if not args.device:
            raise ValueError("no --device")
        server.calls = Rogue(args.device, args.address)
    except Exception as exc:
        server.refuse_to_start(f"the rogue target cannot start: {type(exc).__name__}: {exc}")
        return 2
    server.hello({"device": args.device, "program": "nvme-rogue"})
    server.serve(sys.stdin.buffer)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
