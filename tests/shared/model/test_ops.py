"""Native CPU kernels against their torch reference, op by op."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time

import pytest
import torch

from shared.model import ops
from shared.model.kernels import build_dir, chosen_isa, cpu_ops, supported_isas

DTYPES = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def test_native_kernels_build_on_this_machine() -> None:
    if platform.machine() != "x86_64":
        pytest.skip("native kernels are built for x86_64 only")
    assert cpu_ops() is not None


def test_a_lock_left_by_a_killed_build_does_not_stop_the_next_load() -> None:
    if cpu_ops() is None:
        pytest.skip("no native kernels on this machine")
    stale = build_dir() / "lock"
    stale.touch()
    code = "from shared.model.kernels import cpu_ops; assert cpu_ops() is not None"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    assert not stale.exists()


def test_the_isa_can_be_forced_to_avx2_and_a_wrong_name_is_refused() -> None:
    if "avx2" not in supported_isas():
        pytest.skip("this CPU has no AVX2")
    code = "from shared.model.kernels import chosen_isa; print(chosen_isa())"
    env = {**os.environ, "KVSTACK_CPU_ISA": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "avx2"
    env["KVSTACK_CPU_ISA"] = "sse9"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "KVSTACK_CPU_ISA='sse9'" in out.stderr
    assert chosen_isa() == supported_isas()[0]  # this process: the best the CPU runs


@pytest.fixture(params=supported_isas() or ("torch",))
def isa(request, monkeypatch) -> str:
    """Kernel tests run on every build this CPU runs: the AVX2 one too on AVX-512 machines."""
    module = cpu_ops(request.param) if request.param != "torch" else None
    if request.param != "torch":
        assert module is not None, f"the {request.param} build failed"
    monkeypatch.setattr(ops, "_native", lambda x: module if x.device.type == "cpu" else None)
    return request.param


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    err = (a.float() - b.float()).abs().max().item()
    assert err <= DTYPES[dtype] * max(1.0, b.float().abs().max().item()), err


@pytest.fixture(params=list(DTYPES), ids=lambda d: str(d).split(".")[-1])
def dtype(request) -> torch.dtype:
    return request.param


def randn(*shape, dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)


def test_rms_norm_and_fused_add(dtype, isa) -> None:
    x, residual, w = randn(7, 96, dtype=dtype), randn(7, 96, dtype=dtype), randn(96, dtype=dtype)
    close(ops.rms_norm(x, w, 1e-6), ops.rms_norm_torch(x, w, 1e-6), dtype)
    expected_res = x + residual
    normed, new_res = ops.add_rms_norm(x.clone(), residual.clone(), w, 1e-6)
    close(new_res, expected_res, dtype)
    close(normed, ops.rms_norm_torch(expected_res, w, 1e-6), dtype)


def test_silu_and_mul(dtype, isa) -> None:
    gate_up = randn(5, 2 * 48, dtype=dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    close(ops.silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up, dtype)


def test_rotary_in_place_on_q_and_k_only(dtype, isa) -> None:
    heads, kv_heads, head_dim = 4, 2, 24
    qkv = randn(6, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    freqs = torch.arange(6).float()[:, None] * torch.rand(head_dim // 2)[None, :]
    native, reference = qkv.clone(), qkv.clone()
    ops.rotary_(native, freqs.cos(), freqs.sin(), heads + kv_heads, head_dim)
    ops.rotary_torch_(reference, freqs.cos(), freqs.sin(), heads + kv_heads, head_dim)
    close(native, reference, dtype)
    rotated = (heads + kv_heads) * head_dim
    assert torch.equal(native[:, rotated:], qkv[:, rotated:])  # v untouched


def test_write_kv_and_decode_attention(dtype, isa) -> None:
    blocks, block_size, kv_heads, heads, head_dim = 20, 4, 2, 6, 16
    k_cache, v_cache = (randn(blocks, block_size, kv_heads, head_dim, dtype=dtype) for _ in "kv")
    qkv = randn(3, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    k, v = k.view(3, kv_heads, head_dim), v.view(3, kv_heads, head_dim)
    table = torch.tensor([[3, 7, 1], [9, 0, 0], [4, 5, 6]])
    context_lens = torch.tensor([11, 2, 12])
    slots = torch.stack(
        [
            table[i, (n - 1) // block_size] * block_size + (n - 1) % block_size
            for i, n in enumerate(context_lens)
        ]
    )
    ops.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache.flatten(0, 1)[slots], k)
    q = q.view(3, heads, head_dim)
    close(
        ops.decode_attention(q, k_cache, v_cache, table, context_lens, 0.25),
        ops.decode_attention_torch(q, k_cache, v_cache, table, context_lens, 0.25),
        dtype,
    )


# ---- Each kernel called directly on every build, at sizes that leave vector tails (not a
# multiple of 8, 16 or 32) and at SmolLM2's own sizes (hidden 576, MLP 1536, head_dim 64).


@pytest.fixture
def native(isa):
    if isa == "torch":
        pytest.skip("no native kernels on this machine")
    return cpu_ops(isa)


@pytest.mark.parametrize(
    ("rows", "k", "n"),
    [(1, 37, 29), (3, 77, 45), (5, 576, 1536), (8, 1536, 576), (2, 3, 1)],
)
def test_small_linear_matches_torch(native, dtype, rows, k, n) -> None:
    x, w, bias = randn(rows, k, dtype=dtype), randn(n, k, dtype=dtype), randn(n, dtype=dtype)
    for b in (None, bias):
        out = x.new_empty(rows, n)
        native.small_linear(out, x, w, b)
        close(out, torch.nn.functional.linear(x, w, b), dtype)


def test_small_linear_on_the_vocab_head(native, dtype) -> None:
    x, w = randn(2, 576, dtype=dtype), randn(49152, 576, dtype=dtype)
    out = x.new_empty(2, 49152)
    native.small_linear(out, x, w, None)
    close(out, x @ w.T, dtype)


def test_small_linear_refuses_mismatched_shapes(native) -> None:
    x, w = torch.ones(1, 8), torch.ones(4, 9)
    with pytest.raises(RuntimeError, match="do not match"):
        native.small_linear(torch.empty(1, 4), x, w, None)


@pytest.mark.parametrize("n", [77, 576, 1000])
def test_norms_with_tails(native, dtype, n) -> None:
    x, residual, w = randn(3, n, dtype=dtype), randn(3, n, dtype=dtype), randn(n, dtype=dtype)
    out = torch.empty_like(x)
    native.rms_norm(out, x, w, 1e-5)
    close(out, ops.rms_norm_torch(x, w, 1e-5), dtype)
    x2, r2 = x.clone(), residual.clone()
    native.add_rms_norm_(x2, r2, w, 1e-5)
    close(r2, x + residual, dtype)
    close(x2, ops.rms_norm_torch(x + residual, w, 1e-5), dtype)


@pytest.mark.parametrize("n", [37, 1536])
def test_silu_and_mul_with_tails(native, dtype, n) -> None:
    gate_up = randn(3, 2 * n, dtype=dtype) * 4  # reaches silu's flat tails both ways
    out = gate_up.new_empty(3, n)
    native.silu_and_mul(out, gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    close(out, torch.nn.functional.silu(gate) * up, dtype)


@pytest.mark.parametrize("head_dim", [20, 64, 80])
def test_rotary_with_tails(native, dtype, head_dim) -> None:
    heads, kv_heads = 9, 3
    qkv = randn(5, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    freqs = torch.arange(5).float()[:, None] * torch.rand(head_dim // 2)[None, :]
    mine, reference = qkv.clone(), qkv.clone()
    native.rotary_(mine, freqs.cos(), freqs.sin(), heads + kv_heads, head_dim)
    ops.rotary_torch_(reference, freqs.cos(), freqs.sin(), heads + kv_heads, head_dim)
    close(mine, reference, dtype)


@pytest.mark.parametrize(("head_dim", "context"), [(20, 7), (64, 150), (72, 33)])
def test_decode_attention_with_tails(native, dtype, head_dim, context) -> None:
    blocks, block_size, kv_heads, heads = 48, 4, 3, 9
    k_cache, v_cache = (randn(blocks, block_size, kv_heads, head_dim, dtype=dtype) for _ in "kv")
    table = torch.randperm(blocks, generator=torch.Generator().manual_seed(1))[:40].view(1, 40)
    table = torch.cat([table, table.flip(1)])
    lens = torch.tensor([context, max(1, context // 3)])
    q = randn(2, heads, head_dim, dtype=dtype) * 3  # peaked scores: softmax's range matters
    out = torch.empty_like(q)
    native.decode_attention(out, q, k_cache, v_cache, table, lens, head_dim**-0.5)
    expected = ops.decode_attention_torch(q, k_cache, v_cache, table, lens, head_dim**-0.5)
    close(out, expected, dtype)


def test_decode_attention_is_the_same_at_any_prefetch_distance(native, dtype) -> None:
    """How far ahead the slots are asked for changes timing, never a number; past the
    context's end it asks for nothing."""
    blocks, block_size, kv_heads, heads, head_dim = 48, 4, 3, 9, 64
    k_cache, v_cache = (randn(blocks, block_size, kv_heads, head_dim, dtype=dtype) for _ in "kv")
    table = torch.randperm(blocks, generator=torch.Generator().manual_seed(3))[:40].view(1, 40)
    table = torch.cat([table, table.flip(1)])
    lens, q = torch.tensor([150, 37]), randn(2, heads, head_dim, dtype=dtype)
    default = native.set_kv_prefetch(0)
    outs = []
    try:
        for distance in (0, 1, None, 1000):  # None: the default, 6 KB of slots ahead
            native.set_kv_prefetch(distance)
            outs.append(torch.empty_like(q))
            native.decode_attention(outs[-1], q, k_cache, v_cache, table, lens, 0.125)
    finally:
        assert native.set_kv_prefetch(default) == 1000
    assert default is None  # the kernel asks its default distance ahead unless told another
    assert all(torch.equal(out, outs[0]) for out in outs[1:])
    close(outs[0], ops.decode_attention_torch(q, k_cache, v_cache, table, lens, 0.125), dtype)
    with pytest.raises(RuntimeError, match="0 or more tokens"):
        native.set_kv_prefetch(-1)


@pytest.mark.parametrize(("lens", "threads"), [((300,), 2), ((300, 1), 4), ((300,), 8)])
def test_decode_attention_over_few_heads_splits_contexts_and_merges(native, dtype, lens, threads):
    """Fewer (sequence, kv head) tasks than twice the threads: each context is cut into
    pieces (of at least 32 tokens; a 1-token context leaves a piece empty) merged by their
    maxima; the result is still the softmax's."""
    blocks, block_size, kv_heads, heads, head_dim = 80, 4, 3, 9, 64
    k_cache, v_cache = (randn(blocks, block_size, kv_heads, head_dim, dtype=dtype) for _ in "kv")
    table = torch.randperm(blocks, generator=torch.Generator().manual_seed(2))[:76]
    table = torch.stack([table, table.flip(0)])[: len(lens)]
    q = randn(len(lens), heads, head_dim, dtype=dtype) * 3
    out, before = torch.empty_like(q), torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        native.decode_attention(out, q, k_cache, v_cache, table, torch.tensor(lens), 0.125)
    finally:
        torch.set_num_threads(before)
    expected = ops.decode_attention_torch(q, k_cache, v_cache, table, torch.tensor(lens), 0.125)
    close(out, expected, dtype)


def test_linear_sends_up_to_the_measured_rows_to_the_native_gemv(native, dtype, monkeypatch):
    calls: list[int] = []

    class Recording:
        def small_linear(self, out, x, w, bias):
            calls.append(x.shape[0])
            native.small_linear(out, x, w, bias)

    monkeypatch.setattr(ops, "_native", lambda x: Recording())
    limit = ops.gemv_max_rows(dtype)
    assert limit >= 1  # float32 too: single rows are memory-bound everywhere
    w = randn(40, 24, dtype=dtype)
    for rows in (1, limit, limit + 1):
        x = randn(rows, 24, dtype=dtype)
        close(ops.linear(x, w, None), torch.nn.functional.linear(x, w), dtype)
    assert calls == [1, limit]
    with ops.gemv_rows({}):
        ops.linear(randn(1, 24, dtype=dtype), w, None)
    assert calls == [1, limit]


def test_a_long_kernel_lets_other_python_threads_run(native) -> None:
    """The engine thread's kernels release the GIL (cpu_ops.cpp's GilRelease), so the asyncio
    loop's thread runs while they do: a stamp of the other thread falls inside a call."""
    x, w = torch.randn(1, 2048), torch.randn(8192, 2048)
    out = x.new_empty(1, 8192)
    calls: list[tuple[float, float]] = []

    def kernels() -> None:
        for _ in range(20):
            start = time.perf_counter()
            native.small_linear(out, x, w, None)
            calls.append((start, time.perf_counter()))

    stamps: list[float] = []
    interval = sys.getswitchinterval()
    # NOTE: a long switch interval: this thread gets the GIL only when the kernels release it
    sys.setswitchinterval(1.0)
    try:
        worker = threading.Thread(target=kernels)
        worker.start()
        while worker.is_alive():
            stamps.append(time.perf_counter())
            time.sleep(0.0001)
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert any(s + 0.0005 < t < e - 0.0005 for s, e in calls for t in stamps), calls[:3]


def test_two_checkouts_of_the_same_sources_build_apart(monkeypatch, tmp_path) -> None:
    from shared.model import kernels

    here = build_dir("avx2")
    copy = tmp_path / "checkout" / "kernels"
    copy.mkdir(parents=True)
    for source in (*kernels.SOURCES, *kernels.HEADERS):
        (copy / source.name).write_bytes(source.read_bytes())
    monkeypatch.setattr(kernels, "HERE", copy)
    monkeypatch.setattr(kernels, "SOURCES", tuple(copy / s.name for s in kernels.SOURCES))
    monkeypatch.setattr(kernels, "HEADERS", tuple(copy / h.name for h in kernels.HEADERS))
    assert build_dir("avx2") != here  # same bytes, another place: torch's build file differs
