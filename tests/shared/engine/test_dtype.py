"""What `--dtype auto` resolves to, by device and weights, and what prefill multiplies in."""

from __future__ import annotations

import pytest

from shared.engine import config
from shared.engine.config import (
    PREFILL_WEIGHTS_CHOICES,
    EngineConfig,
    keeps_prefill_copy,
    keeps_quantized_weights,
    prefill_matmul_dtype,
    resolve_dtype,
)
from shared.engine.runner import prefill_bf16
from shared.errors import KvstackError
from shared.worker.config import WorkerConfig


@pytest.fixture(params=[True, False], ids=["native-bf16", "no-bf16"])
def native_bf16(request, monkeypatch) -> bool:
    monkeypatch.setattr(config, "cpu_has_native_bf16", lambda: request.param)
    return request.param


def test_auto_with_quantized_weights_on_cpu_is_float32_with_bf16_prefill_where_native(
    native_bf16,
) -> None:
    assert resolve_dtype("auto", "cpu", quantized=True) == "float32"
    wanted = "bfloat16" if native_bf16 else "float32"
    assert prefill_matmul_dtype("auto", "cpu", quantized=True) == wanted
    # float weights: bfloat16 throughout where native, as before
    assert resolve_dtype("auto", "cpu") == wanted
    assert prefill_matmul_dtype("auto", "cpu") == wanted


def test_a_dtype_asked_for_is_kept_and_float32_stays_float32_throughout(native_bf16) -> None:
    for quantized in (True, False):
        assert resolve_dtype("float32", "cpu", quantized) == "float32"
        assert prefill_matmul_dtype("float32", "cpu", quantized) == "float32"
        assert resolve_dtype("bfloat16", "cpu", quantized) == "bfloat16"
    assert resolve_dtype("auto", "cuda", quantized=True) == "bfloat16"
    assert prefill_matmul_dtype("auto", "cuda:0", quantized=True) == "bfloat16"


def test_which_weights_stay_quantized(smollm2_dir) -> None:
    assert keeps_quantized_weights("SmolLM2-135M-Instruct", "auto")  # the package's GGUF
    assert keeps_quantized_weights(str(smollm2_dir), "q8_0")  # re-quantized at load
    assert not keeps_quantized_weights(str(smollm2_dir), "auto")  # a converted directory
    assert not keeps_quantized_weights("SmolLM2-135M-Instruct", "float")
    assert not keeps_quantized_weights("SmolLM2-135M-Instruct", "auto", "cuda")
    assert not keeps_quantized_weights("no-such-model", "auto")  # the loader says why


def test_the_engine_config_resolves_with_its_weights(native_bf16) -> None:
    quantized = EngineConfig()  # the package's Q4_1 GGUF, blocks kept
    assert quantized.quantized_weights and quantized.resolved_dtype == "float32"
    assert quantized.prefill_matmul_dtype == ("bfloat16" if native_bf16 else "float32")
    floats = EngineConfig(weights="float")
    assert floats.resolved_dtype == floats.prefill_matmul_dtype


def test_prompts_attend_in_bfloat16_only_where_their_matmuls_multiply_in_it(native_bf16) -> None:
    assert prefill_bf16(EngineConfig()) == native_bf16  # auto, the GGUF's blocks, float rows
    assert not prefill_bf16(EngineConfig(activations="q8"))  # prefill rounds as decode does
    for finer in ("q16", "float"):  # their own rounding is finer than bfloat16's
        assert prefill_bf16(EngineConfig(activations=finer)) == native_bf16
    assert not prefill_bf16(EngineConfig(dtype="float32"))  # float32 stays exact
    assert prefill_bf16(EngineConfig(weights="float")) == native_bf16  # so is its KV there


def test_a_prefill_copy_is_kept_in_the_dtype_asked_for_or_where_it_fits(monkeypatch) -> None:
    monkeypatch.setattr(config, "physical_memory_bytes", lambda: 8 << 30)
    fits, too_big = 1 << 30, (1 << 30) + 1  # an eighth of memory, and a byte more
    for dtype in ("bfloat16", "float32"):  # what prompts multiply in
        assert keeps_prefill_copy("auto", dtype, fits)
        assert not keeps_prefill_copy("auto", dtype, too_big)
        assert keeps_prefill_copy(dtype, dtype, too_big)  # asked for: whatever its size
        assert not keeps_prefill_copy("quantized", dtype, 1)
    # a copy in a dtype prompts do not multiply in would never be read
    assert not keeps_prefill_copy("bfloat16", "float32", 1)
    assert not keeps_prefill_copy("float32", "bfloat16", 1)
    assert set(PREFILL_WEIGHTS_CHOICES) == {"auto", "quantized", "bfloat16", "float32"}


def test_an_unknown_prefill_weights_choice_is_refused() -> None:
    with pytest.raises(KvstackError, match="unknown prefill weights 'fp8'"):
        EngineConfig(prefill_weights="fp8")


def test_a_decode_worker_keeps_no_copy_unless_asked() -> None:
    assert WorkerConfig().engine_config().prefill_weights == "auto"  # a prefill worker's
    assert WorkerConfig().engine_config(prefills=False).prefill_weights == "quantized"
    asked = WorkerConfig(prefill_weights="bfloat16")
    assert asked.engine_config(prefills=False).prefill_weights == "bfloat16"


def test_a_containers_memory_limit_bounds_the_memory_the_copy_is_measured_against(
    tmp_path,
) -> None:
    v2, v1, missing = tmp_path / "memory.max", tmp_path / "limit_in_bytes", tmp_path / "none"
    v2.write_text("max\n")  # no limit
    v1.write_text(f"{3 << 30}\n")  # a pod's 3Gi
    assert config.cgroup_memory_limits((v2, v1, missing)) == [3 << 30]
    v2.write_text(f"{2 << 30}\n")
    assert config.cgroup_memory_limits((v2, missing)) == [2 << 30]
    assert config.physical_memory_bytes() > 0
