"""A TCP proxy for tests: forwards both ways, records what the sender wrote, flips one byte."""

from __future__ import annotations

import socket
import threading


class FlipProxy:
    """Forwards 127.0.0.1:port to `upstream`; XORs the sender's byte at stream offset
    `flip_at` (None: flips nothing) and keeps a copy of everything the sender wrote. With
    `answers`, the same for what `upstream` writes back (a receiver answering an ask)."""

    def __init__(self, upstream: str, flip_at: int | None = None, answers: bool = False) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.flip_at = flip_at
        self.answers = answers
        self.sent = bytearray()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listener.getsockname()[1]}"

    def close(self) -> None:
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        server = socket.create_connection(self.upstream)
        self.sockets += [client, server]
        up, down = (False, True) if self.answers else (True, False)
        threading.Thread(target=self._pump, args=(client, server, up), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client, down), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, tampered: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if tampered:
                    data = self._tamper(bytearray(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _tamper(self, data: bytearray) -> bytearray:
        start = len(self.sent)
        if self.flip_at is not None and start <= self.flip_at < start + len(data):
            data[self.flip_at - start] ^= 0xFF
        self.sent += data
        return data
