"""The fused decode step (one native call for every layer) against the module path: the same
logits, bit for bit, on SmolLM2 with float32 and quantized weights, in float32 and (quantized)
bfloat16, on the GEMV or by the kept bfloat16 copies, on every kernel build."""

from __future__ import annotations

import types

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.runner import ModelRunner, SeqChunk
from shared.errors import KvstackError
from shared.kvcache import KVStorage
from shared.model import ops, quant
from shared.model.attention import TorchPagedAttention
from shared.model.fused_decode import MAX_COPY_ROWS, FusedDecode, fused_decode
from shared.model.kernels import cpu_ops, supported_isas
from shared.model.loader import load_model
from shared.model.quant import set_activations
from shared.model.quant_loader import load_model_as
from shared.model.registry import gguf_source

MODEL = "SmolLM2-135M-Instruct"
BLOCK_SIZE = 4  # short prompts cross several blocks
# Each sequence's blocks: scattered, not in order, not consecutive.
BLOCKS = {"a": [5, 2, 9, 14], "b": [7, 1, 12, 10], "c": [3, 11, 0, 8, 6]}
PROMPTS = {"a": [1, 504, 2, 17, 260], "b": [9, 4, 30, 2, 88, 6, 1000, 3, 45], "c": [77, 12]}

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")


@pytest.fixture(scope="module")
def models(smollm2_dir) -> dict[str, torch.nn.Module]:
    """SmolLM2 as float32, with the file's own Q4_1 blocks, and re-quantized to Q8_0; and
    with its Q4_1 blocks in bfloat16 ("auto-bf16")."""
    load = lambda weights, dtype=torch.float32: load_model_as(
        weights, smollm2_dir, gguf_source(MODEL), dtype, "cpu"
    )
    loaded = {weights: load(weights) for weights in ("float", "auto", "q8_0")}
    return {**loaded, "auto-bf16": load("auto", torch.bfloat16)}


@pytest.fixture(params=supported_isas())
def isa(request, monkeypatch) -> str:
    """The module path on this build's kernels too (the chosen build is read once a process)."""
    module = cpu_ops(request.param)
    assert module is not None, f"the {request.param} build failed"
    monkeypatch.setattr(ops, "_native", lambda x: module if x.device.type == "cpu" else None)
    monkeypatch.setattr(quant, "_kernels", lambda: module)
    return request.param


def runner(model, fused: bool, isa: str | None = None, blocks: int = 16) -> ModelRunner:
    """A runner on a pool of its own, its fused decode on the `isa` build (default: chosen)."""
    cfg, dtype = model.config, model.norm.weight.dtype
    storage = KVStorage(cfg.num_layers, blocks, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim, dtype)
    backend = TorchPagedAttention(storage, cfg.head_dim)
    built = ModelRunner(model, storage, backend, fused=False)
    built.fused = fused_decode(model, backend, isa) if fused else None
    return built


def decode(tokens: dict[str, list[int]], names: str) -> list[SeqChunk]:
    return [SeqChunk(n, tokens[n][-1:], len(tokens[n]) - 1, BLOCKS[n]) for n in names]


def prefill(name: str) -> SeqChunk:
    return SeqChunk(name, PROMPTS[name], 0, BLOCKS[name])


class FusedCalls:
    def __init__(self, monkeypatch) -> None:
        self.count = 0
        forward = FusedDecode.forward

        def counted(fused, *args):
            self.count += 1
            return forward(fused, *args)

        monkeypatch.setattr(FusedDecode, "forward", counted)


def assert_same(fused: list[torch.Tensor], plain: list[torch.Tensor]) -> None:
    assert len(fused) == len(plain)
    for a, b in zip(fused, plain, strict=True):
        assert torch.equal(a, b), (a - b).abs().max().item()


@pytest.mark.parametrize(
    ("weights", "activations"),
    [
        ("float", "float"),
        ("auto", "float"),
        ("auto", "q8"),
        ("auto", "q16"),
        ("q8_0", "q8"),
        ("auto-bf16", "q16"),
        ("auto-bf16", "float"),
    ],
    ids=[
        "float32",
        "q4_1",
        "q4_1-q8act",
        "q4_1-q16act",
        "q8_0-q8act",
        "q4_1-bf16-q16act",
        "q4_1-bf16-floatact",
    ],
)
def test_fused_decode_steps_give_the_module_paths_logits_bit_for_bit(
    models, isa, weights, activations, monkeypatch
) -> None:
    model = models[weights]
    set_activations(model, activations)
    fused, plain = runner(model, True, isa), runner(model, False)
    assert fused.fused is not None
    # a float32 stack over quantized weights computes the logits too (the head is their GEMV)
    assert fused.fused.stack.has_head() == (weights == "auto" or weights == "q8_0")
    calls = FusedCalls(monkeypatch)
    tokens = {name: list(ids) for name, ids in PROMPTS.items()}
    for step in range(6):  # the prompts, then three steps of B=3 and two of B=1
        chunks = (
            [prefill(n) for n in "abc"]
            if step == 0
            else decode(tokens, "abc" if step <= 3 else "b")
        )
        out_fused, out_plain = fused.execute(chunks), plain.execute(chunks)
        assert_same(out_fused, out_plain)
        for chunk, logits in zip(chunks, out_fused, strict=True):
            tokens[chunk.request_id].append(int(logits[-1].argmax()))
    assert calls.count == 5  # every decode step, no prefill


def test_timing_a_steps_parts_counts_each_step_and_changes_no_logit(models) -> None:
    """DecodeStack.time_parts (bench step-phases): while on, each step's parts add their time
    and the steps are counted; off, nothing is; the logits are the same either way."""
    model = models["auto"]
    set_activations(model, "q16")
    timed, untimed = runner(model, True), runner(model, True)
    stack = timed.fused.stack
    tokens = {name: list(ids) for name, ids in PROMPTS.items()}
    for both in (timed, untimed):
        both.execute([prefill(n) for n in "abc"])
    stack.time_parts(True)
    for names in ("abc", "b"):
        chunks = decode(tokens, names)
        assert_same(timed.execute(chunks), untimed.execute(chunks))
    times = stack.part_times()
    assert times.pop("steps") == 2
    ran = ("setup", "qkv", "attention", "o", "norms", "gate_up", "silu_mul", "down")
    assert all(times[part] > 0 for part in (*ran, "final norm and head"))
    assert times["layer by copy"] == 0  # both steps on the GEMV
    stack.time_parts(False)
    timed.execute(decode(tokens, "a"))
    assert stack.part_times()["steps"] == 0 and stack.part_times()["qkv"] == 0


def test_a_step_with_a_prefill_chunk_or_hooks_or_another_backend_is_not_fused(
    models, monkeypatch
) -> None:
    model = models["auto"]
    set_activations(model, "q8")
    fused, plain = runner(model, True), runner(model, False)
    calls = FusedCalls(monkeypatch)
    tokens = {name: list(ids) for name, ids in PROMPTS.items()}
    for r in (fused, plain):
        r.execute([prefill("a"), prefill("b")])
    tokens["a"].append(0)
    tokens["b"].append(1)
    mixed = [*decode(tokens, "ab"), prefill("c")]
    assert_same(fused.execute(mixed), plain.execute(mixed))
    layers_done: list[int] = []
    hooked = fused.execute(decode(tokens, "a"), on_layer_done=layers_done.append)
    assert_same(hooked, plain.execute(decode(tokens, "a")))
    assert layers_done == list(range(model.config.num_layers))
    fused.execute(decode(tokens, "b"), backend=TorchPagedAttention(fused.storage, 64))
    assert calls.count == 0


def test_the_native_stack_refuses_bad_input_with_a_clear_error(tiny_llama_dir) -> None:
    model = load_model(tiny_llama_dir)
    cfg = model.config
    storage = KVStorage(cfg.num_layers, 4, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
    fused = fused_decode(model, TorchPagedAttention(storage, cfg.head_dim))
    assert fused is not None
    cos, sin = model.rotary.tables(8)
    good = dict(
        token_ids=torch.tensor([1, 2]),
        cos=cos,
        sin=sin,
        slots=torch.tensor([0, 5]),
        block_table=torch.tensor([[0, 0], [1, 2]]),
        context_lens=torch.tensor([1, 6]),
    )
    fused.stack.step(*good.values())
    vocab = cfg.vocab_size
    bad = {
        "token_ids must be a contiguous CPU Long": dict(token_ids=torch.tensor([1, 2]).int()),
        "with 1 <= B <= 16": dict(token_ids=torch.zeros(17, dtype=torch.long)),
        f"token {vocab} is outside the vocabulary": dict(token_ids=torch.tensor([1, vocab])),
        "cos must be": dict(cos=cos[:, 1:]),
        "past the rotary tables' 4": dict(cos=cos[:4], sin=sin[:4]),
        "slots must be a contiguous CPU Long": dict(slots=torch.tensor([0, 5]).int()),
        "slot 16 is outside": dict(slots=torch.tensor([0, 16])),
        "block 4 is outside": dict(block_table=torch.tensor([[0, 0], [1, 4]])),
        "does not fit its 2 blocks": dict(context_lens=torch.tensor([1, 9])),
    }
    for message, change in bad.items():
        with pytest.raises(RuntimeError, match=message):
            fused.stack.step(*{**good, **change}.values())
    assert not fused.stack.has_head()  # a float head: compute_logits's
    with pytest.raises(RuntimeError, match="logits come from a stack with a head"):
        fused.stack.step(*good.values(), logits=True)
    assert not fused.stack.takes_copies()
    with pytest.raises(RuntimeError, match="a step by copy needs a float32 stack"):
        fused.stack.step(*good.values(), by_copy=True)
    with pytest.raises(RuntimeError, match="a model without layers"):
        norm = model.norm.weight
        cpu_ops().DecodeStack([], 1, 1, 2, 1e-5, 1.0, storage.kv, norm, None, norm)
    assert fused_decode(model, TorchPagedAttention(KVStorage(2, 0, 4, 2, 16), 16)) is None
    # bfloat16 stacks are for quantized linears only (their GEMV computes in float32)
    bf16 = load_model(tiny_llama_dir, torch.bfloat16)
    kv = KVStorage(cfg.num_layers, 4, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
    assert fused_decode(bf16, TorchPagedAttention(kv, cfg.head_dim)) is None


def test_steps_of_more_rows_than_every_layers_gemv_takes_are_not_fused(tiny_llama_dir) -> None:
    model = load_model(tiny_llama_dir)
    cfg = model.config
    storage = KVStorage(cfg.num_layers, 4, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
    fused = fused_decode(model, TorchPagedAttention(storage, cfg.head_dim))
    assert fused is not None and fused.has_float
    assert fused.fits(1) and not fused.fits(0) and not fused.fits(9)
    with ops.gemv_rows({torch.float32: 2}):  # float32 rows past 2 go to the library GEMM
        assert fused.fits(2) and not fused.fits(3)


def test_a_step_of_sixteen_rows_is_fused_and_gives_the_module_paths_logits(
    models, isa, monkeypatch
) -> None:
    """Past the 8 rows the stack once took: 16 sequences decode in one native call."""
    model = models["auto"]
    set_activations(model, "q16")
    fused, plain = runner(model, True, isa, blocks=48), runner(model, False, blocks=48)
    calls = FusedCalls(monkeypatch)
    names = [f"s{i}" for i in range(16)]
    blocks = {n: [47 - 3 * i, 3 * i + 1, 46 - 3 * i] for i, n in enumerate(names)}
    tokens = {n: [100 + 7 * i, 30 + i, 2] for i, n in enumerate(names)}
    chunks = [SeqChunk(n, tokens[n], 0, blocks[n]) for n in names]
    for _ in range(4):  # the prompts, then three steps of 16 rows
        out_fused, out_plain = fused.execute(chunks), plain.execute(chunks)
        assert_same(out_fused, out_plain)
        for chunk, logits in zip(chunks, out_fused, strict=True):
            tokens[chunk.request_id].append(int(logits[-1].argmax()))
        chunks = [SeqChunk(n, tokens[n][-1:], len(tokens[n]) - 1, blocks[n]) for n in names]
    assert calls.count == 3


def test_rows_a_kept_bf16_copy_takes_are_not_on_the_gemv() -> None:
    """From the copy's copy_min_rows on, the module path multiplies by the copy (rounding
    as bfloat16 does): those steps are not the GEMV's."""
    copied = [types.SimpleNamespace(copy_min_rows=10, prefill_copy=object())]
    fused = FusedDecode(None, None, False, 16, copied)  # type: ignore[arg-type]
    assert fused.on_gemv(9) and not fused.on_gemv(10)
    assert not fused.fits(10)  # no stack that takes the copies: the module path's
    copied[0].copy_min_rows = 16  # a benchmark's "before" changes it after the build
    assert fused.on_gemv(15) and not fused.on_gemv(16)
    assert FusedDecode(None, None, False, 16).fits(16)  # type: ignore[arg-type]


@pytest.fixture(params=["packed", "plain"])
def copied_model(models, request):
    """The Q4_1 model with bfloat16 copies kept (packed by oneDNN where it can, as the engine
    keeps them, or plain: the other CPUs'), many rows multiplying in bfloat16 (as `--dtype auto`
    on a CPU with native bfloat16): removed again after the test."""
    packed = request.param == "packed"
    if packed and not quant.can_pack(torch.bfloat16):
        pytest.skip("oneDNN packs no bfloat16 weights on this CPU")
    model = models["auto"]
    quant.set_prefill_dtype(model, torch.bfloat16)
    quant.keep_prefill_copies(model, torch.bfloat16, packed)
    yield model
    for module in model.modules():
        if isinstance(module, quant.QuantLinear):
            module.prefill_copy = None
    quant.set_prefill_dtype(model, torch.float32)


@pytest.mark.parametrize("activations", ["q16", "float"])
def test_steps_the_copies_take_are_fused_by_them_and_give_the_module_paths_logits(
    copied_model, isa, activations, monkeypatch
) -> None:
    """24, 20 and 16 rows multiply by the bfloat16 copies in one native call, bit for bit as
    layer by layer."""
    model = copied_model
    set_activations(model, activations)
    fused, plain = runner(model, True, isa, blocks=80), runner(model, False, blocks=80)
    assert fused.fused is not None and fused.fused.all_copied
    assert quant.BF16_COPY_MIN_ROWS == 16
    assert fused.fused.by_copy(16) and not fused.fused.by_copy(15)
    calls = FusedCalls(monkeypatch)
    names = [f"s{i}" for i in range(24)]
    blocks = {n: [79 - 3 * i, 3 * i + 1, 78 - 3 * i] for i, n in enumerate(names)}
    tokens = {n: [100 + 7 * i, 30 + i, 2] for i, n in enumerate(names)}
    chunks = [SeqChunk(n, tokens[n], 0, blocks[n]) for n in names]
    for rows in (24, 20, 16):  # the prompts, then a step of 24 rows, 20, 16
        out_fused, out_plain = fused.execute(chunks), plain.execute(chunks)
        assert_same(out_fused, out_plain)
        for chunk, logits in zip(chunks, out_fused, strict=True):
            tokens[chunk.request_id].append(int(logits[-1].argmax()))
        chunks = [SeqChunk(n, tokens[n][-1:], len(tokens[n]) - 1, blocks[n]) for n in names[:rows]]
    assert_same(fused.execute(chunks), plain.execute(chunks))
    assert calls.count == 3


def test_a_step_goes_by_copy_only_while_the_module_path_would(copied_model) -> None:
    model = copied_model
    set_activations(model, "q16")
    fused = runner(model, True).fused
    assert fused is not None and fused.by_copy(20)
    assert fused.by_copy(MAX_COPY_ROWS) and not fused.by_copy(MAX_COPY_ROWS + 1)
    quant.set_copy_min_rows(model, 24)  # a benchmark's "before"
    assert not fused.by_copy(16) and fused.on_gemv(16) and fused.by_copy(24)
    quant.set_copy_min_rows(model, quant.BF16_COPY_MIN_ROWS)
    set_activations(model, "q8")  # q8 rows never multiply in bfloat16
    assert not fused.by_copy(20)
    set_activations(model, "q16")
    quant.set_prefill_dtype(model, torch.float32)
    assert not fused.by_copy(20)
    quant.set_prefill_dtype(model, torch.bfloat16)
    linear = model.layers[3].mlp.down_proj
    linear.keep_prefill_copy(torch.bfloat16)  # a new copy: not the one the stack holds
    assert not fused.by_copy(20)


def test_the_engine_config_switch_is_validated() -> None:
    assert EngineConfig(fused_decode=False).fused_decode is False
    with pytest.raises(KvstackError, match="fused_decode must be true or false"):
        EngineConfig(fused_decode="no")  # type: ignore[arg-type]


def test_a_step_hook_keeps_decode_fused_where_a_layer_hook_does_not(
    tiny_llama_dir, monkeypatch
) -> None:
    """`kvstack serve` marks when each request starts computing; it must do so without a
    per-layer hook, which costs every decode step its fused path."""
    from services.colocated.engine_backend import EngineBackend
    from shared.engine.engine import LLMEngine
    from shared.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", num_blocks=64))
    calls = FusedCalls(monkeypatch)
    backend = EngineBackend()
    backend._added["r"] = 0.0  # as the gateway's add would have
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("r", [1, 50, 2, 17], params)
    steps = 0
    while engine.has_unfinished:
        backend.step(engine)
        steps += 1
    assert calls.count == steps - 1  # every step after the prompt's
    assert "r" in backend._computing  # marked at its first step
    seen: list[int] = []
    engine.add_request("s", [9, 4, 30], params)
    engine.step(on_scheduled=lambda chunks: seen.append(len(chunks)))  # the prompt
    engine.step(layer_hook=lambda layer, chunks: None)
    assert seen == [1] and calls.count == steps - 1  # the layer-hooked decode was not fused


def test_steps_on_another_thread_run_their_loops_on_the_pool_and_match(models, monkeypatch):
    """The services step on a thread of their own, where the fused step runs its loops on its
    own pool instead of OpenMP: the same logits, bit for bit."""
    import concurrent.futures

    native = cpu_ops()
    model = models["auto"]
    set_activations(model, "float")
    on_main, on_thread = runner(model, True), runner(model, True)
    tokens = {name: list(ids) for name, ids in PROMPTS.items()}
    step_thread = concurrent.futures.ThreadPoolExecutor(1)

    def on_step_thread(chunks):
        torch.set_num_threads(2)  # a pool needs two threads or more
        return on_thread.execute(chunks)

    for r in (on_main, on_thread):
        r.execute([prefill(n) for n in "abc"])
    for n in "abc":
        tokens[n].append(7)
    for enabled in (True, False):  # the pool, then OpenMP on the same thread
        previous = native.use_step_pool(enabled)
        try:
            chunks = decode(tokens, "abc")
            expected = on_main.execute(chunks)
            assert_same(step_thread.submit(on_step_thread, chunks).result(), expected)
        finally:
            native.use_step_pool(previous)
    step_thread.shutdown()


def test_the_start_up_log_says_which_path_decode_steps_take(tiny_llama_dir, models) -> None:
    from shared.engine.runner import decode_path

    model = load_model(tiny_llama_dir)
    float_head = decode_path(runner(model, True), EngineConfig())
    assert float_head.startswith("fused") and "to the final norm" in float_head
    set_activations(models["auto"], "q16")
    assert "to the logits" in decode_path(runner(models["auto"], True), EngineConfig())
    plain = runner(model, False)
    assert "turned off" in decode_path(plain, EngineConfig(fused_decode=False))
    assert "no fused step" in decode_path(plain, EngineConfig())


def prefilled_pair(model, isa: str) -> tuple[ModelRunner, ModelRunner, dict[str, list[int]]]:
    """Two fused runners that prefilled the three prompts, and each prompt with its first
    token (the argmax of its last logits)."""
    one, other = runner(model, True, isa), runner(model, True, isa)
    tokens = {name: list(ids) for name, ids in PROMPTS.items()}
    for r in (one, other):
        first = r.execute([prefill(n) for n in "abc"])
    for name, logits in zip("abc", first, strict=True):
        tokens[name].append(int(logits[-1].argmax()))
    return one, other, tokens


@pytest.mark.parametrize("activations", ["q16", "q8"])
def test_a_burst_chooses_each_steps_argmax_and_writes_the_same_kv(models, isa, activations):
    """DecodeStack.burst: five greedy steps of three rows in one native call choose what five
    fused steps' argmax chooses, and leave the KV the step after reads the same."""
    model = models["auto"]
    set_activations(model, activations)
    bursting, stepping, tokens = prefilled_pair(model, isa)
    first_tokens = {name: ids[: len(PROMPTS[name]) + 1] for name, ids in tokens.items()}
    assert bursting.burst_takes(3) and bursting.burst_takes(1)
    burst = bursting.burst(decode(tokens, "abc"), 5)
    for _ in range(5):
        chunks = decode(tokens, "abc")
        for chunk, logits in zip(chunks, stepping.execute(chunks), strict=True):
            tokens[chunk.request_id].append(int(logits[-1].argmax()))
    assert burst == [tokens[name][-5:] for name in "abc"]
    after = decode(tokens, "abc")
    assert_same(bursting.execute(after), stepping.execute(after))
    # a stop set (by another thread) while it runs ends it after the step in progress
    stop = torch.ones(1, dtype=torch.uint8)
    ended = bursting.burst(decode(first_tokens, "abc"), 5, stop)  # from the prompts' end again
    assert ended == [[row[0]] for row in burst]


def test_a_row_whose_logits_turn_non_finite_mid_burst_gets_minus_one_from_there_on(
    models, isa
) -> None:
    """Position 11's rotary row made NaN: only row b reaches it (its third step), so b's
    tokens are two good ones and then -1 (the sampler's SAMPLING_FAILED) to the burst's end
    although its later steps' logits need not be NaN; rows a and c decode as before."""
    model = models["auto"]
    set_activations(model, "q16")
    clean, poisoned, tokens = prefilled_pair(model, isa)
    expected = clean.burst(decode(tokens, "abc"), 5)
    cos, sin = model.rotary.tables(64)  # the tables every burst reads, changed in place
    kept = cos[11].clone(), sin[11].clone()
    try:
        with torch.inference_mode():  # as the tables may have been made
            cos[11], sin[11] = float("nan"), float("nan")
        got = poisoned.burst(decode(tokens, "abc"), 5)
    finally:
        with torch.inference_mode():
            cos[11], sin[11] = kept
    assert got[0] == expected[0] and got[2] == expected[2]
    assert got[1] == [*expected[1][:2], -1, -1, -1]


def test_a_burst_refuses_bad_input_with_a_clear_error(models, tiny_llama_dir) -> None:
    model = models["auto"]
    set_activations(model, "q16")
    fused = runner(model, True).fused
    assert fused is not None
    cos, sin = model.rotary.tables(16)
    good = dict(
        token_ids=torch.tensor([1]),
        cos=cos,
        sin=sin,
        block_table=torch.tensor([[2, 3]]),
        context_lens=torch.tensor([5]),
        steps=2,
        stop=torch.zeros(1, dtype=torch.uint8),
    )
    assert fused.stack.burst(*good.values()).shape == (2, 1)
    bad = {
        "steps must be at least 1": dict(steps=0),
        "positions 5 to 8 do not fit its 2 blocks": dict(context_lens=torch.tensor([6]), steps=4),
        "context_lens must be a contiguous CPU Long": dict(context_lens=torch.tensor([5]).int()),
        "block_table must be a contiguous CPU Long": dict(block_table=torch.tensor([[2, 3]]).int()),
        "slot 64 is outside the pool": dict(block_table=torch.tensor([[2, 16]])),
        "stop must be a CPU uint8 tensor": dict(stop=torch.zeros(1, dtype=torch.int32)),
        "with 1 <= B <= 16": dict(
            token_ids=torch.ones(17, dtype=torch.long),
            block_table=torch.zeros(17, 2, dtype=torch.long),
            context_lens=torch.ones(17, dtype=torch.long),
        ),
    }
    for message, change in bad.items():
        with pytest.raises(RuntimeError, match=message):
            fused.stack.burst(*{**good, **change}.values())
    float_head = runner(load_model(tiny_llama_dir), True).fused
    assert float_head is not None and not float_head.burst_takes(1)
    with pytest.raises(RuntimeError, match="the stack needs a head"):
        float_head.stack.burst(*good.values())
