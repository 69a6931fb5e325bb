"""A TCP proxy that damages bytes on their way to the server: the data plane's adversary."""

from __future__ import annotations

import socket
import threading


class CorruptingProxy:
    """Forwards 127.0.0.1:<port> to `target`, flipping the byte at `offset` of the client's
    stream (and every `every` bytes after it, if set) on the first `connections` links."""

    def __init__(self, target_port: int, offset: int, every: int = 0, connections: int = 1):
        self.target_port, self.offset, self.every = target_port, offset, every
        self.connections_left = connections
        self.num_flipped = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            damage = self.connections_left > 0
            self.connections_left -= 1
            threading.Thread(target=self._pump, args=(client, server, damage), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, damage: bool) -> None:
        seen = 0
        try:
            while data := src.recv(1 << 16):
                if damage:
                    data = self._damage(bytearray(data), seen)
                seen += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _damage(self, data: bytearray, seen: int) -> bytes:
        for position in range(seen, seen + len(data)):
            if position == self.offset or (
                self.every and position > self.offset and (position - self.offset) % self.every == 0
            ):
                data[position - seen] ^= 0xFF
                self.num_flipped += 1
        return bytes(data)

    def close(self) -> None:
        self.listener.close()


class CuttingProxy:
    """Forwards 127.0.0.1:<port> to `target`; after `cut_after` bytes of the first link it
    calls `on_cut` (e.g. kill the sender) and closes the link: a source dying mid-transfer.
    With `hold`, the link stays open and silent instead until `close`: a stalled source.
    With `answers`, the bytes counted are those the target sends back, on whichever link
    first passes `cut_after` (a kvstore answering a get on the connection it came on)."""

    def __init__(
        self, target_port: int, cut_after: int, on_cut, hold: bool = False, answers: bool = False
    ) -> None:
        self.target_port, self.cut_after, self.on_cut = target_port, cut_after, on_cut
        self.hold, self.answers = hold, answers
        self._once = threading.Lock()
        self.closed = threading.Event()
        self.cut = False
        self.error: Exception | None = None
        self.links = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the target is gone (killed): so is this link
                client.close()
                continue
            self.links += 1
            cut_this = self.links == 1 and not self.answers
            threading.Thread(
                target=self._pump, args=(client, server, cut_this), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, self.answers), daemon=True
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, cut_this: bool) -> None:
        seen = 0
        try:
            while data := src.recv(1 << 14):
                if cut_this and seen + len(data) >= self.cut_after and self._once.acquire(False):
                    dst.sendall(data[: max(0, self.cut_after - seen)])
                    self.cut = True
                    self.on_cut()
                    if self.hold:
                        self.closed.wait()
                    break
                seen += len(data)
                dst.sendall(data)
        except ConnectionError as e:  # once `on_cut` killed the target, its links reset
            if not self.cut:
                self.error = e
        except Exception as e:
            self.error = e
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
