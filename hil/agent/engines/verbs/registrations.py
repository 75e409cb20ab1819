"""A process's registrations: register_memory handles (MRs) and register_rdma_memory windows (MWs).

* register_memory: one MR per registration (access 0 for READ, LOCAL_WRITE for WRITE/READWRITE);
  the handle IS the MR's lkey;
* register_rdma_memory: an MR with LOCAL_WRITE|MW_BIND and a type-2 memory window bound on the
  socket's QP (or, in ``mr`` mode, an MR with the remote rights); the descriptor packs
  {address, length, window rkey}. Every MR and window lies in the socket's own PD, so its rkey works
  through that socket's QP only (the NIC checks the PD: R2 in either mode);
* the same range registered again is the same registration, reference counted (R13);
* deregistration: IBV_WR_LOCAL_INV on the window rkey, dealloc the MW, dereg the MR; verbs objects
  the device will not release yet are kept and retried (and reported by ``leaks``).

Standard library + pyverbs, Python 3.9 compatible.
"""

from __future__ import annotations

import time
from typing import Any

from pyverbs.mr import MR, MW, MWBindInfo  # type: ignore[import-not-found]
from pyverbs.wr import SendWR  # type: ignore[import-not-found]

from hil.agent.engines.verbs import enums as e
from hil.agent.engines.verbs.state import ProcessState, Registration, Socket, pack_descriptor, unpack_descriptor
from pytest_san.contract import (
    DESCRIPTOR_SIZE,
    VALID_ACCESS,
    Access,
    SanError,
    Status,
    WsaError,
    is_int,
)


class RegistrationsMixin(ProcessState):
    """Registrations: memory handles and RDMA windows, their reference counts, release and leaks."""

    def _check_register(self, sock: Socket, address: int, length: int, access: int) -> None:
        if not is_int(access) or access not in VALID_ACCESS:
            raise SanError(WsaError.WSAEINVAL, f"access flags {access!r} are not READ, WRITE or READWRITE")
        if not is_int(address) or not is_int(length) or length < 0:
            raise SanError(WsaError.WSAEINVAL, f"a buffer's address and length are integers, the length not negative: "
                           f"got {address!r}, {length!r}")
        self._refresh(sock)
        if sock.state != "connected":
            raise SanError(WsaError.WSAENOTCONN, f"socket {sock.id} is {sock.state}, not connected")
        if self._mapping_of(address, length) is None:
            raise SanError(WsaError.WSAEFAULT, f"{length!r} bytes at {address!r} are not wholly inside "
                           f"the address space of pid {self.pid}")

    def register_memory(self, socket: int, address: int, length: int, access: int) -> int:
        sock = self._socket(socket)
        self._check_register(sock, address, length, access)
        key = ("memory", address, length, access)
        reg = sock.by_range.get(key)
        if reg is not None:
            reg.refs += 1  # R13: the same handle, reference counted
            return reg.key
        flags = 0 if access == Access.READ else e.IBV_ACCESS_LOCAL_WRITE
        try:
            mr = MR(sock.pd, length, flags, address=address)
        except Exception as exc:
            raise SanError(WsaError.WSAENOBUFS, f"ibv_reg_mr of {length} bytes at {address:#x} failed: {exc}") from None
        reg = Registration("memory", int(mr.lkey), address, length, access, mr, None)
        sock.handles[reg.key] = reg
        sock.by_range[key] = reg
        return reg.key

    def deregister_memory(self, socket: int, handle: int) -> None:
        sock = self._socket(socket)
        reg = sock.handles.get(handle) if is_int(handle) else None
        if reg is None:
            raise SanError(WsaError.WSAEINVAL, f"handle {handle!r} is not registered on socket {sock.id}")
        self._release(sock, reg)

    def register_rdma_memory(self, socket: int, address: int, length: int, access: int,
                             descriptor_size: int | None = None) -> bytes:
        sock = self._socket(socket)
        if descriptor_size is not None and not is_int(descriptor_size):
            raise SanError(WsaError.WSAEINVAL, f"descriptor_size is an integer or None, got {descriptor_size!r}")
        if descriptor_size is not None and descriptor_size < DESCRIPTOR_SIZE:
            raise SanError(WsaError.WSAEFAULT, f"a descriptor needs {DESCRIPTOR_SIZE} bytes, {descriptor_size} offered",
                           required_size=DESCRIPTOR_SIZE)
        self._check_register(sock, address, length, access)
        key = ("rdma", address, length, access)
        reg = sock.by_range.get(key)
        if reg is not None:
            reg.refs += 1
            return pack_descriptor(reg, self.iwarp)
        remote = (e.IBV_ACCESS_REMOTE_READ if access & Access.READ else 0) | \
                 (e.IBV_ACCESS_REMOTE_WRITE if access & Access.WRITE else 0)
        if self.mw_mode == "mr":
            reg = self._register_rdma_mr(sock, address, length, access, remote)
        else:
            reg = self._register_rdma_window(sock, address, length, access, remote)
        sock.windows[reg.key] = reg
        sock.by_range[key] = reg
        return pack_descriptor(reg, self.iwarp)

    def _register_rdma_mr(self, sock: Socket, address: int, length: int, access: int, remote: int) -> Registration:
        """Without type-2 windows: the MR itself carries the remote rights; being in the socket's PD, it is
        reachable through the socket's QP only."""
        try:
            mr = MR(sock.pd, length, e.IBV_ACCESS_LOCAL_WRITE | remote, address=address)
        except Exception as exc:
            raise SanError(WsaError.WSAENOBUFS, f"ibv_reg_mr of {length} bytes at {address:#x} failed: {exc}") from None
        return Registration("rdma", int(mr.rkey), address, length, access, mr, None)

    def _register_rdma_window(self, sock: Socket, address: int, length: int, access: int,
                              remote: int) -> Registration:
        try:
            mr = MR(sock.pd, length, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_MW_BIND, address=address)
        except Exception as exc:
            raise SanError(WsaError.WSAENOBUFS, f"ibv_reg_mr of {length} bytes at {address:#x} failed: {exc}") from None
        try:
            mw = MW(sock.pd, e.IBV_MW_TYPE_2)
        except Exception as exc:
            self._close_verbs(mr)
            raise SanError(WsaError.WSAENOBUFS, f"ibv_alloc_mw(TYPE_2) failed: {exc}") from None
        wr = SendWR(wr_id=self._internal_id(), opcode=e.IBV_WR_BIND_MW, num_sge=0, send_flags=e.IBV_SEND_SIGNALED)
        # set_bind_wr puts inc_rkey(mw.rkey) into bind_mw.rkey: that new key (wr.rkey) is the window's
        # rkey once bound; pyverbs' MW.rkey keeps showing the key from ibv_alloc_mw.
        wr.set_bind_wr(mw, MWBindInfo(mr, address, length, remote))
        rkey = int(wr.rkey)
        status = self._run_internal(sock, wr)
        if status is not None and status != Status.SUCCESS.value:
            self._close_verbs(mw)
            self._close_verbs(mr)
            self._refresh(sock)
            if sock.state != "connected":
                raise SanError(WsaError.WSAENOTCONN, f"socket {sock.id} went to {sock.state} while binding "
                               f"a window (wc status {status})")
            raise SanError(WsaError.WSAENOBUFS, f"binding a type-2 window failed with wc status {status}")
        return Registration("rdma", rkey, address, length, access, mr, mw)

    def _window_of(self, sock: Socket, descriptor: Any) -> Registration | None:
        if not isinstance(descriptor, (bytes, bytearray)) or len(descriptor) != DESCRIPTOR_SIZE:
            raise SanError(WsaError.WSAEINVAL, f"a descriptor is {DESCRIPTOR_SIZE} bytes, got {descriptor!r}")
        return sock.windows.get(unpack_descriptor(bytes(descriptor))[2])

    def deregister_rdma_memory(self, socket: int, descriptor: bytes) -> None:
        sock = self._socket(socket)
        reg = self._window_of(sock, descriptor)
        if reg is None:
            raise SanError(WsaError.WSAEINVAL,
                           f"descriptor {bytes(descriptor).hex()} is not registered on socket {sock.id}")
        self._release(sock, reg)

    def _release(self, sock: Socket, reg: Registration, force: bool = False) -> None:
        if not force:
            if reg.in_use:
                raise SanError(WsaError.WSAEINVAL, f"{reg!r} is in use by {reg.in_use} pending operation(s)")
            reg.refs -= 1
            if reg.refs:
                return
        table = sock.handles if reg.kind == "memory" else sock.windows
        del table[reg.key]
        del sock.by_range[(reg.kind, reg.address, reg.length, reg.access)]
        if reg.mw is not None:
            # R3: invalidate the window on its QP, then free it (dealloc alone also revokes the rkey).
            if not force and sock.state == "connected":
                wr = SendWR(wr_id=self._internal_id(), opcode=e.IBV_WR_LOCAL_INV, num_sge=0,
                            send_flags=e.IBV_SEND_SIGNALED, imm_data=reg.key)  # imm_data shares invalidate_rkey
                self._run_internal(sock, wr)
            self._close_verbs(reg.mw)
        self._close_verbs(reg.mr)
        reg.mr = reg.mw = None

    def _close_verbs(self, obj: Any) -> None:
        """Close an MR or MW; an MR the device still holds (a window on it) is retried later."""
        for _ in range(50):
            try:
                obj.close()
                return
            except Exception:
                time.sleep(0.01)
        self._zombies.append(obj)

    def registrations(self, socket: int) -> list[dict[str, Any]]:
        if socket in self._closed_sockets:
            return []
        sock = self._socket(socket)
        return [reg.describe() for reg in list(sock.handles.values()) + list(sock.windows.values())]

    def leaks(self) -> list[str]:
        """Registrations still alive on open sockets, and verbs objects the device would not release."""
        out = []
        for sock in self._sockets.values():
            for reg in list(sock.handles.values()) + list(sock.windows.values()):
                out.append(f"pid {self.pid} socket {sock.id}: {reg!r}")
        self._retry_zombies()
        out += [f"pid {self.pid}: unreleased {type(z).__name__}" for z in self._zombies]
        return out

    def _retry_zombies(self) -> None:
        keep = []
        for obj in self._zombies:
            try:
                obj.close()
            except Exception:
                keep.append(obj)
        self._zombies = keep
