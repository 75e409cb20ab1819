"""A process's registrations: register_memory handles (MRs) and register_rdma_memory windows (MWs).

* register_memory: one MR per registration (access 0 for READ, LOCAL_WRITE for WRITE/READWRITE);
  the handle IS the MR's lkey;
* register_rdma_memory: an MR with LOCAL_WRITE|MW_BIND and a type-2 memory window bound on the
  socket's QP (or, in ``mr`` mode, an MR with the remote rights); the descriptor packs
  {address, length, window rkey}. Every MR and window lies in the socket's own PD, so its rkey works
  through that socket's QP only (the NIC checks the PD: R2 in either mode);
* the same range registered again is the same registration, reference counted (R13);
* deregistration: IBV_WR_LOCAL_INV on the window rkey, dealloc the MW, dereg the MR; verbs objects
  the device will not release yet are kept and retried (``releases.py``);
* where ``rxe-local-op-replayed`` applies (quirks.py), no bind or invalidate is posted behind an outstanding
  request: such a window is an MR with the remote rights, and its release is the dealloc alone.

Standard library + pyverbs, Python 3.9 compatible.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyverbs.mr import MR, MW, MWBindInfo
from pyverbs.wr import SendWR

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.completions import Completions
from hil.agent.engines.verbs.context import DeviceContext
from hil.agent.engines.verbs.memory import Buffers
from hil.agent.engines.verbs.records import Registration, Socket, pack_descriptor, unpack_descriptor
from hil.agent.engines.verbs.releases import Releases
from hil.agent.engines.verbs.sockets import Sockets
from pytest_san.spi import checks
from pytest_san.spi.contract import (
    Access,
    SanError,
    Status,
    WsaError,
    is_int,
)


def _register_mr(sock: Socket, address: int, length: int, flags: int) -> Any:
    """An MR of ``length`` bytes at ``address`` in the socket's PD; a refusal of the device is WSAENOBUFS."""
    try:
        return MR(sock.pd, length, flags, address=address)
    except Exception as exc:
        raise SanError(WsaError.WSAENOBUFS, f"ibv_reg_mr of {length} bytes at {address:#x} failed: {exc}") from None


class Registrations:
    """Owns nothing of its own: the registrations live in their socket's tables (``Socket.handles``,
    ``Socket.windows``, ``Socket.by_range``); this part makes, counts and releases them.

    Gets the device (its window mode, its transport), the buffers (a range must be mapped), the sockets,
    the completions (a window is bound and invalidated by the engine's own work requests) and the
    releases."""

    def __init__(self, device: DeviceContext, pid: int, buffers: Buffers, sockets: Sockets,
                 completions: Completions, releases: Releases) -> None:
        self._device = device
        self._pid = pid
        self._buffers = buffers
        self._sockets = sockets
        self._completions = completions
        self._releases = releases

    def _checked(self, socket: int, address: object, length: object, access: object, *, rdma: bool,
                 descriptor_size: object = None) -> tuple[Socket, int, int, int]:
        """The socket, range and access once pytest_san.spi.checks' values and state stages passed (the agent ran
        the objects stage: whose buffer it is)."""
        sock = self._sockets.get(socket)
        self._sockets.refresh(sock)
        address, length, flags, _, _ = checks.registration_values(
            "rdma" if rdma else "memory", address, length, access, descriptor_size,
            not_connected=None if sock.state == "connected" else f"socket {sock.id} is {sock.state}, not connected",
            resolve=self._buffers.holding)
        return sock, address, length, int(flags)

    def register_memory(self, socket: int, address: int, length: int, access: int) -> int:
        sock, address, length, access = self._checked(socket, address, length, access, rdma=False)
        key = ("memory", address, length, access)
        reg = sock.by_range.get(key)
        if reg is not None:
            reg.refs += 1  # R13: the same handle, reference counted
            return reg.key
        mr = _register_mr(sock, address, length, 0 if access == Access.READ else e.IBV_ACCESS_LOCAL_WRITE)
        reg = Registration("memory", int(mr.lkey), address, length, access, mr, None)
        sock.handles[reg.key] = reg
        sock.by_range[key] = reg
        return reg.key

    def deregister_memory(self, socket: int, handle: int) -> None:
        sock = self._sockets.get(socket)
        reg = checks.deregistration(sock.handles.get(handle) if is_int(handle) else None, handle)
        self.release(sock, reg)

    def register_rdma_memory(self, socket: int, address: int, length: int, access: int,
                             descriptor_size: int | None = None) -> bytes:
        sock, address, length, access = self._checked(socket, address, length, access, rdma=True,
                                                      descriptor_size=descriptor_size)
        key = ("rdma", address, length, access)
        reg = sock.by_range.get(key)
        if reg is not None:
            reg.refs += 1
            return pack_descriptor(reg, self._device.iwarp)
        remote = (e.IBV_ACCESS_REMOTE_READ if access & Access.READ else 0) | \
                 (e.IBV_ACCESS_REMOTE_WRITE if access & Access.WRITE else 0)
        if self._device.mw_mode == "mr" or self._no_local_op(sock):
            reg = self._register_rdma_mr(sock, address, length, access, remote)
        else:
            reg = self._register_rdma_window(sock, address, length, access, remote)
        sock.windows[reg.key] = reg
        sock.by_range[key] = reg
        return pack_descriptor(reg, self._device.iwarp)

    def _no_local_op(self, sock: Socket) -> bool:
        """True where a bind or invalidate posted now would sit behind an outstanding request that rxe may
        replay it with (``rxe-local-op-replayed``)."""
        return self._device.no_local_ops_behind and bool(sock.send_ops)

    def _register_rdma_mr(self, sock: Socket, address: int, length: int, access: int, remote: int) -> Registration:
        """Without type-2 windows: the MR itself carries the remote rights; being in the socket's PD, it is
        reachable through the socket's QP only."""
        mr = _register_mr(sock, address, length, e.IBV_ACCESS_LOCAL_WRITE | remote)
        return Registration("rdma", int(mr.rkey), address, length, access, mr, None)

    def _register_rdma_window(self, sock: Socket, address: int, length: int, access: int,
                              remote: int) -> Registration:
        mr = _register_mr(sock, address, length, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_MW_BIND)
        try:
            mw = MW(sock.pd, e.IBV_MW_TYPE_2)
        except Exception as exc:
            self._releases.close(mr)
            raise SanError(WsaError.WSAENOBUFS, f"ibv_alloc_mw(TYPE_2) failed: {exc}") from None
        wr = SendWR(wr_id=self._completions.internal_id(), opcode=e.IBV_WR_BIND_MW, num_sge=0,
                    send_flags=e.IBV_SEND_SIGNALED)
        # set_bind_wr puts inc_rkey(mw.rkey) into bind_mw.rkey: that new key (wr.rkey) is the window's
        # rkey once bound; pyverbs' MW.rkey keeps showing the key from ibv_alloc_mw.
        wr.set_bind_wr(mw, MWBindInfo(mr, address, length, remote))
        rkey = int(wr.rkey)
        status = self._completions.run_internal(sock, wr)
        if status is not None and status != Status.SUCCESS.value:
            self._releases.close(mw)
            self._releases.close(mr)
            self._sockets.refresh(sock)
            if sock.state != "connected":
                raise SanError(WsaError.WSAENOTCONN, f"socket {sock.id} went to {sock.state} while binding "
                               f"a window (wc status {status})")
            raise SanError(WsaError.WSAENOBUFS, f"binding a type-2 window failed with wc status {status}")
        return Registration("rdma", rkey, address, length, access, mr, mw)

    def deregister_rdma_memory(self, socket: int, descriptor: bytes) -> None:
        sock = self._sockets.get(socket)
        desc = checks.descriptor(descriptor)
        reg = checks.deregistration(sock.windows.get(unpack_descriptor(desc)[2]), desc)
        self.release(sock, reg)

    def release(self, sock: Socket, reg: Registration, force: bool = False) -> None:
        if not force:  # checks.deregistration refused it in use
            reg.refs -= 1
            if reg.refs:
                return
        table = sock.handles if reg.kind == "memory" else sock.windows
        del table[reg.key]
        del sock.by_range[(reg.kind, reg.address, reg.length, reg.access)]
        if reg.mw is not None:
            # R3: invalidate the window on its QP, then free it (dealloc alone also revokes the rkey).
            if not force and sock.state == "connected" and not self._no_local_op(sock):
                wr = SendWR(wr_id=self._completions.internal_id(), opcode=e.IBV_WR_LOCAL_INV, num_sge=0,
                            send_flags=e.IBV_SEND_SIGNALED, imm_data=reg.key)  # imm_data shares invalidate_rkey
                self._completions.run_internal(sock, wr)
            self._releases.close(reg.mw)
        self._releases.close(reg.mr)
        reg.mr = reg.mw = None

    def release_all(self, sock: Socket) -> None:
        """Every registration of a socket being closed (the provider releases what pending operations used)."""
        for reg in list(sock.handles.values()) + list(sock.windows.values()):
            self.release(sock, reg, force=True)

    def registrations(self, socket: int) -> list[dict[str, Any]]:
        if self._sockets.is_closed(socket):
            return []
        sock = self._sockets.get(socket)
        return [reg.describe() for reg in list(sock.handles.values()) + list(sock.windows.values())]

    def all(self) -> Iterator[tuple[Socket, Registration]]:
        """Every live registration of the process's open sockets."""
        for sock in self._sockets.open():
            for reg in list(sock.handles.values()) + list(sock.windows.values()):
                yield sock, reg

    def leaks(self) -> list[str]:
        """Registrations still alive on open sockets."""
        return [f"pid {self._pid} socket {sock.id}: {reg!r}" for sock, reg in self.all()]
