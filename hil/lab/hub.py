"""One Ethernet segment for the lab's guests, carried over 127.0.0.1: a relay for qemu's socket netdev.

Every guest's lab NIC is ``-netdev socket,connect=127.0.0.1:PORT``; qemu sends each Ethernet frame as a
4-byte big-endian length followed by the frame. The hub floods every frame to every other connected
guest, as an Ethernet hub does (a handful of guests: learning addresses would buy nothing). qemu's
multicast socket mode is not used because its traffic would leave 127.0.0.1.

Run as ``python -m hil.lab.hub --port-file PATH``: it listens on an ephemeral 127.0.0.1 port and writes
the port number to PATH once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import struct
import sys
from pathlib import Path

__all__ = ["MAX_FRAME", "Hub", "main"]

HOST = "127.0.0.1"
MAX_FRAME = 128 * 1024  # qemu's largest is 69632 bytes; anything bigger is not qemu talking
MAX_BACKLOG = 4 * 1024 * 1024  # bytes queued for a slow guest before its frames are dropped, as a wire would
_HEADER = struct.Struct("!I")


class Hub:
    """The relay; ``serve`` runs it on the current event loop until cancelled."""

    def __init__(self, log: bool = True) -> None:
        self.clients: dict[int, asyncio.StreamWriter] = {}
        self.frames = 0
        self.dropped = 0
        self._next = 0
        self._log = log

    def say(self, message: str) -> None:
        if self._log:
            print(f"hub: {message}", file=sys.stderr, flush=True)

    async def start(self, port: int = 0) -> asyncio.Server:
        server = await asyncio.start_server(self._client, HOST, port)
        return server

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._next += 1
        me = self._next
        self.clients[me] = writer
        self.say(f"guest #{me} connected from {writer.get_extra_info('peername')}; {len(self.clients)} on the segment")
        try:
            while True:
                header = await reader.readexactly(_HEADER.size)
                (length,) = _HEADER.unpack(header)
                if length > MAX_FRAME:
                    self.say(f"guest #{me}: frame of {length} bytes; dropping the connection")
                    break
                frame = await reader.readexactly(length)
                self.frames += 1
                for other, out in list(self.clients.items()):
                    if other == me:
                        continue
                    if out.transport.get_write_buffer_size() > MAX_BACKLOG:
                        self.dropped += 1
                        continue
                    out.write(header + frame)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            del self.clients[me]
            writer.close()
            self.say(f"guest #{me} left; {len(self.clients)} on the segment")


async def _serve(port_file: Path) -> None:
    # The handlers go in before the port file appears: whoever reads the file may signal at once.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    hub = Hub()
    server = await hub.start()
    port = server.sockets[0].getsockname()[1]
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, port_file)  # the controller polls for the file: it must never read a partial number
    hub.say(f"listening on {HOST}:{port}")
    async with server:
        await stop.wait()
    hub.say(f"stopping after {hub.frames} frames ({hub.dropped} dropped)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hil.lab.hub", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--port-file", type=Path, required=True, help="where to write the listening port")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
