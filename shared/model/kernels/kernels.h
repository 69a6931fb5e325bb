// The kernels' entry points, for the sources that compose them (decode_stack.cpp). Each is
// implemented once, in the source named beside it; none of them touches the GIL when its
// caller has already released it.
#pragma once

#include <torch/extension.h>

namespace kernels {

// cpu_ops.cpp: float32, bfloat16 or float16 tensors
void rms_norm(torch::Tensor out, torch::Tensor x, torch::Tensor w, double eps);
void add_rms_norm_(torch::Tensor x, torch::Tensor residual, torch::Tensor w, double eps);
void silu_and_mul(torch::Tensor out, torch::Tensor gate_up);
void rotary_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t num_heads,
             int64_t head_dim);
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor k_cache, torch::Tensor v_cache,
              torch::Tensor slots);
void decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                      torch::Tensor v_cache, torch::Tensor block_table,
                      torch::Tensor context_lens, double scale);
void small_linear(torch::Tensor out, torch::Tensor x, torch::Tensor w,
                  c10::optional<torch::Tensor> bias);

// quant_ops.cpp: GGUF blocks on float32 activations
void quant_gemv(torch::Tensor out, torch::Tensor x, torch::Tensor w, int64_t qtype,
                c10::optional<torch::Tensor> bias);

// quant_dot.cpp: GGUF blocks on activations rounded to 8 bits
void quant_gemv_q8(torch::Tensor out, torch::Tensor x, torch::Tensor w, int64_t qtype,
                   c10::optional<torch::Tensor> bias, bool portable);

}  // namespace kernels
