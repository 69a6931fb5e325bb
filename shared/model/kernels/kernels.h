// The kernels' entry points, for the sources that compose or bind them (decode_stack.cpp,
// bindings.cpp). Each is implemented once, in the source named beside it; none of them
// touches the GIL when its caller has already released it. Only ATen here: the kernel sources
// stay clear of <torch/extension.h> and pybind11, the slow headers (docs/development.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

namespace kernels {

// cpu_ops.cpp: float32, bfloat16 or float16 tensors
void rms_norm(at::Tensor out, at::Tensor x, at::Tensor w, double eps);
void add_rms_norm_(at::Tensor x, at::Tensor residual, at::Tensor w, double eps);
void silu_and_mul(at::Tensor out, at::Tensor gate_up);
void rotary_(at::Tensor qkv, at::Tensor cos, at::Tensor sin, int64_t num_heads,
             int64_t head_dim);
void write_kv(at::Tensor k, at::Tensor v, at::Tensor k_cache, at::Tensor v_cache,
              at::Tensor slots);
void decode_attention(at::Tensor out, at::Tensor q, at::Tensor k_cache,
                      at::Tensor v_cache, at::Tensor block_table,
                      at::Tensor context_lens, double scale);
void small_linear(at::Tensor out, at::Tensor x, at::Tensor w,
                  c10::optional<at::Tensor> bias);

// prefill_attention.cpp: q, out [T, H, D] over k, v [L, H_kv, D], query i seeing keys up to
// L - T + i; in bfloat16 products where asked and this build has them (the second one says)
void prefill_attention(at::Tensor out, at::Tensor q, at::Tensor k, at::Tensor v, double scale,
                       bool bf16_products);
bool prefill_attention_has_bf16_products();

// quant_ops.cpp: GGUF blocks on float32 activations; a qtype with quant_blocks::kInterleaved
// is rows interleaved 8 at a time (quant_x8.h), which quant_gemv refuses
void quant_gemv(at::Tensor out, at::Tensor x, at::Tensor w, int64_t qtype,
                c10::optional<at::Tensor> bias);
void quant_gemm(at::Tensor out, at::Tensor x, at::Tensor w, int64_t qtype,
                c10::optional<at::Tensor> bias, int64_t tile_rows);
void quant_dequantize(at::Tensor out, at::Tensor w, int64_t qtype);
// out = w's Q4_0, Q4_1 or Q8_0 rows interleaved 8 at a time (quant_x8.h), or back
void quant_interleave(at::Tensor out, at::Tensor w, int64_t qtype, bool interleave);
// out [I, K] float32 = rows `index` of w dequantized (an embedding's lookup)
void quant_lookup(at::Tensor out, at::Tensor w, at::Tensor index, int64_t qtype);
// How far ahead of each weight row the GEMVs prefetch (bytes, 0: not at all); the old value.
int64_t set_weight_prefetch(int64_t bytes);
// How many tokens ahead decode attention asks for each cached slot (0: none; none given:
// as many as make kKvPrefetchBytes, its default); the old value.
c10::optional<int64_t> set_kv_prefetch(c10::optional<int64_t> tokens);
// Whether the interleaved GEMVs of 4 rows of x or more take two groups of 8 weight rows a
// 512-bit vector where the build has AVX-512 (else one group a 256-bit vector, as AVX2 builds
// always do); the old value.
bool set_gemv_x16(bool on);

// quant_dot.cpp: GGUF blocks on activations rounded to 8 or 16 bits
void quant_gemv_int(at::Tensor out, at::Tensor x, at::Tensor w, int64_t qtype,
                    c10::optional<at::Tensor> bias, int64_t bits, bool portable);
void quant_round_rows(at::Tensor out, at::Tensor x, int64_t bits);

// greedy.cpp: each row of float32 logits [rows, vocab]: its first maximum (the first NaN where
// there is one, as numpy's argmax), and whether that value is finite
std::tuple<std::vector<int64_t>, std::vector<bool>> greedy_rows(at::Tensor logits);

}  // namespace kernels
