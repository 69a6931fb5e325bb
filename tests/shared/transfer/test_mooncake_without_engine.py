"""The Mooncake transport's pure parts (addresses, allocations, copies, control messages): they
need no engine, so these run where `mooncake` is not installed."""

from __future__ import annotations

import socket

import numpy as np
import torch

from shared.transfer.base import BlockSpan
from shared.transfer.common.frames import checked_frame
from shared.transfer.mooncake.control import (
    KIND_ASK,
    KIND_LANDED,
    Place,
    encode_ask,
    encode_landed,
    encode_places,
    read_ask,
    read_checksums,
    read_header,
    read_places,
)
from shared.transfer.mooncake.memory import (
    Copy,
    address_of,
    allocation_of,
    coalesced,
    region_of,
    views_of,
)
from shared.transfer.mooncake.parts import parts_of
from shared.transfer.tensor_bytes import kv_span_bytes, tensor_bytes


def test_allocation_of_a_kv_span_is_the_whole_tensor() -> None:
    kv = torch.zeros(3, 2, 8, 4, 2, 8, dtype=torch.bfloat16)
    k, v = kv_span_bytes(kv, 1, BlockSpan(5, 1, 2))
    assert allocation_of(k) == allocation_of(v) == (kv.data_ptr(), kv.data_ptr() + kv.nbytes)
    assert region_of(k)[1] - region_of(k)[0] == 2 * 2 * 8 * 2


def test_allocation_of_buffers_and_arrays() -> None:
    buffer = bytearray(100)
    start = address_of(memoryview(buffer))
    assert allocation_of(memoryview(buffer)[10:20]) == (start, start + 100)
    array = np.zeros(64, dtype=np.uint8)
    assert allocation_of(memoryview(array[8:16])) == (array.ctypes.data, array.ctypes.data + 64)


def test_views_of_tensors_and_buffers_are_flat_bytes() -> None:
    tensor, buffer = torch.zeros(4, 4), bytearray(10)
    views = views_of([tensor, buffer])
    assert [v.nbytes for v in views] == [64, 10] and all(v.format == "B" for v in views)
    assert address_of(views[0]) == tensor.data_ptr()


def test_coalesced_merges_runs_contiguous_on_both_sides() -> None:
    copies = [
        Copy(0, 1000, 10),
        Copy(10, 1010, 10),
        Copy(20, 2000, 10),
        Copy(30, 2010, 0),
        Copy(30, 2010, 5),
    ]
    assert coalesced(copies) == [Copy(0, 1000, 20), Copy(20, 2000, 15)]


def test_coalesced_merges_k_and_v_runs_given_interleaved() -> None:
    """Spans come as K0, V0, K1, V1: the K halves and the V halves each form one run."""
    copies = [Copy(0, 500, 8), Copy(100, 600, 8), Copy(8, 508, 8), Copy(108, 608, 8)]
    assert coalesced(copies) == [Copy(0, 500, 16), Copy(100, 600, 16)]


def test_address_of_writable_read_only_and_empty_views() -> None:
    array = np.arange(16, dtype=np.uint8)
    assert address_of(memoryview(array)[4:]) == array.ctypes.data + 4
    read_only = memoryview(bytes(16))
    assert address_of(read_only[4:]) == address_of(read_only) + 4
    assert isinstance(address_of(memoryview(array)[:0]), int)


def test_parts_close_once_they_hold_part_bytes() -> None:
    buffer = memoryview(bytearray(64))
    spans = [
        (buffer[0:8], buffer[8:16], Place(1000, 2000, True)),
        (buffer[16:24], buffer[24:32], Place()),
        (buffer[32:40], buffer[40:48], Place(1016, 2016, True)),
    ]
    parts = parts_of(spans, part_bytes=32)
    assert [len(p.spans) for p in parts] == [2, 1]
    assert parts[0].nbytes == 16  # the refused span is not written
    assert len(parts[0].checksums()) == 2 and parts[0].checksums()[1] == 0
    assert [len(p.spans) for p in parts_of([], 32)] == [0]  # an empty frame: one empty part


def test_control_messages_round_trip() -> None:
    kv = tensor_bytes(torch.arange(64, dtype=torch.float32))
    frame = checked_frame(
        "req",
        7,
        [
            (BlockSpan(3, 1, 2, 0xABC), kv[0:32], kv[32:64]),
            (BlockSpan(4, 0, 1), kv[64:96], kv[96:128]),
        ],
    )
    places = [Place(1 << 40, (1 << 40) + 32, True), Place()]
    left, right = socket.socketpair()
    with left, right:
        left.sendall(encode_ask(frame) + encode_places(7, places) + encode_landed(frame, [11, 22]))
        ask = read_header(right)
        assert (ask.kind, ask.request_id, ask.layer, ask.count) == (KIND_ASK, "req", 7, 2)
        assert read_ask(right, 2) == [(BlockSpan(3, 1, 2, 0xABC), 32), (BlockSpan(4, 0, 1), 32)]
        assert read_places(right, read_header(right).count) == places
        landed = read_header(right)
        assert (landed.kind, landed.request_id) == (KIND_LANDED, "req")
        assert read_checksums(right, landed.count) == [11, 22]
