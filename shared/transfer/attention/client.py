"""The decode worker's side of the link to one attention worker: frames go out from the
engine thread; a reader thread lands each output as it arrives and stamps its arrival,
so the engine knows how much of the round trip it spent waiting."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence

import orjson
import torch

from shared.transfer.attention.wire import (
    GREETING,
    KIND_ERROR,
    KIND_OUT,
    KIND_QKV,
    KIND_RELEASE,
    KIND_STEP,
    encode_step,
    read_header,
    send_frame,
)
from shared.transfer.common.counters import Counters
from shared.transfer.common.frames import ProtocolError
from shared.transfer.common.handshake import HANDSHAKE_TIMEOUT_S, answer_hello
from shared.transfer.common.sockets import recv_exact, shut_down, split_peer, tune
from shared.transfer.tcp.sockets import recv_hashed
from shared.transfer.tensor_bytes import tensor_bytes


class AttentionLost(ConnectionError):
    """An attention worker of the group is gone (or refused to compute)."""


class AttentionLink:
    def __init__(
        self,
        peer: str,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        auth_token: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.peer = peer
        self.row_shape = (num_heads, head_dim)
        self.dtype = dtype
        self.timeout = timeout
        self.counters = Counters("qkv_bytes", "out_bytes", "control_bytes")
        self._results: dict[tuple[int, int], tuple[torch.Tensor, float]] = {}
        self._ready = threading.Condition()
        self._send_lock = threading.Lock()
        self.error = ""
        self._sock = self._connect(peer, auth_token)
        self._reader = threading.Thread(target=self._read_loop, name="attn-link", daemon=True)
        self._reader.start()

    @staticmethod
    def _connect(peer: str, auth_token: str | None) -> socket.socket:
        try:
            sock = socket.create_connection(split_peer(peer), timeout=HANDSHAKE_TIMEOUT_S)
            tune(sock, None)
            answer_hello(sock, auth_token, GREETING)
        except (OSError, ProtocolError) as e:
            raise AttentionLost(f"attention worker at {peer}: {e}") from None
        sock.settimeout(None)
        return sock

    def begin_step(self, micro_batch: int, chunks: Sequence) -> None:
        self._send(KIND_STEP, micro_batch, 0, "control_bytes", encode_step(chunks))

    def send_qkv(
        self, micro_batch: int, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        views = [tensor_bytes(t.contiguous()) for t in (q, k, v)]
        self._send(KIND_QKV, micro_batch, layer, "qkv_bytes", *views)

    def release(self, request_ids: list[str]) -> None:
        self._send(KIND_RELEASE, 0, 0, "control_bytes", orjson.dumps(request_ids))

    def result(self, micro_batch: int, layer: int) -> tuple[torch.Tensor, float]:
        """The output of (micro-batch, layer) and when it arrived (perf_counter seconds)."""
        key = (micro_batch, layer)
        with self._ready:
            if not self._ready.wait_for(lambda: key in self._results or self.error, self.timeout):
                raise AttentionLost(
                    f"attention worker at {self.peer}: no answer in {self.timeout:g}s"
                )
            if key not in self._results:
                raise AttentionLost(f"attention worker at {self.peer}: {self.error}")
            return self._results.pop(key)

    def close(self) -> None:
        shut_down(self._sock)
        self._reader.join(timeout=5.0)
        self._sock.close()

    def _send(self, kind: int, micro_batch: int, layer: int, counter: str, *payload) -> None:
        if self.error:
            raise AttentionLost(f"attention worker at {self.peer}: {self.error}")
        try:
            with self._send_lock:
                size = send_frame(self._sock, kind, micro_batch, layer, *payload)
        except OSError as e:
            self._fail(f"send failed: {e}")
            raise AttentionLost(f"attention worker at {self.peer}: {e}") from None
        self.counters.add(**{counter: size})

    def _read_loop(self) -> None:
        try:
            while (header := read_header(self._sock)) is not None:
                self._land(*header)
            self._fail("connection closed")
        except (OSError, ProtocolError) as e:
            self._fail(str(e) or type(e).__name__)

    def _land(self, kind: int, micro_batch: int, layer: int, size: int) -> None:
        if kind == KIND_ERROR:
            raise ProtocolError(f"refused: {recv_exact(self._sock, size).decode(errors='replace')}")
        if kind != KIND_OUT:
            raise ProtocolError(f"unexpected frame kind {kind} from an attention worker")
        row_bytes = self.row_shape[0] * self.row_shape[1] * self.dtype.itemsize
        if size % row_bytes:
            raise ProtocolError(f"OUT of {size} bytes is not whole rows of {row_bytes}")
        out = torch.empty((size // row_bytes, *self.row_shape), dtype=self.dtype)
        recv_hashed(self._sock, [(tensor_bytes(out), None)])
        self.counters.add(out_bytes=size)
        with self._ready:
            self._results[(micro_batch, layer)] = (out, time.perf_counter())
            self._ready.notify_all()

    def _fail(self, error: str) -> None:
        with self._ready:
            self.error = self.error or error
            self._ready.notify_all()
