// Fused CPU kernels for the model's small, memory-bound steps. Each has a pure-torch
// twin in shared/model/ops.py, which is the reference the tests compare against.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

template <typename T>
inline float f32(T v) { return static_cast<float>(v); }

// ---- RMSNorm ------------------------------------------------------------------------
template <typename T>
void rms_norm_row(T* out, const T* x, const T* w, int64_t n, float eps) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += f32(x[i]) * f32(x[i]);
  const float r = 1.f / std::sqrt(sum / n + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = T(f32(w[i]) * f32(T(f32(x[i]) * r)));
}

void rms_norm(torch::Tensor out, torch::Tensor x, torch::Tensor w, double eps) {
  const int64_t rows = x.size(0), n = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    auto* o = out.data_ptr<scalar_t>();
    auto* xi = x.data_ptr<scalar_t>();
    auto* wi = w.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) rms_norm_row(o + r * n, xi + r * n, wi, n, float(eps));
    });
  });
}

// residual += x; x = rms_norm(residual) * w  (both in place)
void add_rms_norm_(torch::Tensor x, torch::Tensor residual, torch::Tensor w, double eps) {
  const int64_t rows = x.size(0), n = x.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    auto* xi = x.data_ptr<scalar_t>();
    auto* ri = residual.data_ptr<scalar_t>();
    auto* wi = w.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* xr = xi + r * n;
        scalar_t* rr = ri + r * n;
        for (int64_t i = 0; i < n; ++i) rr[i] = scalar_t(f32(xr[i]) + f32(rr[i]));
        rms_norm_row(xr, rr, wi, n, float(eps));
      }
    });
  });
}

// ---- SwiGLU -------------------------------------------------------------------------
void silu_and_mul(torch::Tensor out, torch::Tensor gate_up) {
  const int64_t rows = gate_up.size(0), n = out.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "silu_and_mul", [&] {
    auto* o = out.data_ptr<scalar_t>();
    auto* g = gate_up.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* gr = g + r * 2 * n;
        scalar_t* orow = o + r * n;
        for (int64_t i = 0; i < n; ++i) {
          const float v = f32(gr[i]);
          const scalar_t s = scalar_t(v / (1.f + std::exp(-v)));
          orow[i] = scalar_t(f32(s) * f32(gr[n + i]));
        }
      }
    });
  });
}

// ---- Rotary embedding, rotate-half layout, in place on the q and k heads of qkv ----------
void rotary_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t num_heads,
             int64_t head_dim) {
  const int64_t tokens = qkv.size(0), row = qkv.stride(0), half = head_dim / 2;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rotary", [&] {
    auto* base = qkv.data_ptr<scalar_t>();
    const float* c = cos.data_ptr<float>();
    const float* s = sin.data_ptr<float>();
    at::parallel_for(0, tokens, 4, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* ct = c + t * half;
        const float* st = s + t * half;
        for (int64_t h = 0; h < num_heads; ++h) {
          scalar_t* x = base + t * row + h * head_dim;
          for (int64_t i = 0; i < half; ++i) {
            const float x1 = f32(x[i]), x2 = f32(x[i + half]);
            x[i] = scalar_t(x1 * ct[i] - x2 * st[i]);
            x[i + half] = scalar_t(x2 * ct[i] + x1 * st[i]);
          }
        }
      }
    });
  });
}

// ---- KV write: new tokens' k and v into their cache slots --------------------------------
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor k_cache, torch::Tensor v_cache,
              torch::Tensor slots) {
  const int64_t tokens = k.size(0), width = k.size(1) * k.size(2);
  const int64_t in_row = k.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, k.scalar_type(), "write_kv", [&] {
    auto* ki = k.data_ptr<scalar_t>();
    auto* vi = v.data_ptr<scalar_t>();
    auto* kc = k_cache.data_ptr<scalar_t>();
    auto* vc = v_cache.data_ptr<scalar_t>();
    const int64_t* sl = slots.data_ptr<int64_t>();
    at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        std::copy(ki + t * in_row, ki + t * in_row + width, kc + sl[t] * width);
        std::copy(vi + t * in_row, vi + t * in_row + width, vc + sl[t] * width);
      }
    });
  });
}

// ---- Widening to float: a loop GCC vectorizes (bf16 -> f32 is a 16-bit shift) -----------
template <typename T>
inline void widen(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32(src[i]);
}

template <>
inline void widen<c10::BFloat16>(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = uint32_t(bits[i]) << 16;
}

// exp for softmax, written so loops of it vectorize (libm's expf does not): 2^n * e^f with
// |f| <= ln2/2 and a degree-6 polynomial; relative error about 2e-7, like expf.
inline float fast_exp(float x) {
  x = std::max(x, -87.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float f = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.f / 720;
  p = p * f + 1.f / 120;
  p = p * f + 1.f / 24;
  p = p * f + 1.f / 6;
  p = p * f + 0.5f;
  p = p * f + 1.f;
  p = p * f + 1.f;
  int32_t bits;
  std::memcpy(&bits, &p, 4);
  bits += int32_t(n) << 23;
  std::memcpy(&p, &bits, 4);
  return p;
}

inline void softmax_(float* x, int64_t n) {
  const float mx = *std::max_element(x, x + n);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = fast_exp(x[i] - mx));
  const float inv = 1.f / sum;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// ---- Decode attention over the paged cache: one query token per sequence -----------------
// q [B, H, D] (row stride q_row), caches [blocks, block_size, H_kv, D], out [B, H, D].
// One task per (sequence, kv head); the task widens a block's rows of its head at a time.
template <typename T>
void decode_attention_task(T* out, const T* q, int64_t q_row, const T* kc, const T* vc,
                           const int64_t* table, int64_t ctx, int64_t b, int64_t hk,
                           int64_t H, int64_t Hkv, int64_t D, int64_t bs, float scale) {
  const int64_t G = H / Hkv, num_blocks = (ctx + bs - 1) / bs;
  std::vector<float> qf(G * D), scores(G * ctx), acc(G * D, 0.f), rows(bs * D);
  widen(q + b * q_row + hk * G * D, qf.data(), G * D);
  auto load_rows = [&](const T* cache, int64_t n, int64_t count) {
    for (int64_t s = 0; s < count; ++s)
      widen(cache + ((table[n] * bs + s) * Hkv + hk) * D, rows.data() + s * D, D);
  };
  for (int64_t n = 0; n < num_blocks; ++n) {
    const int64_t count = std::min(bs, ctx - n * bs);
    load_rows(kc, n, count);
    for (int64_t s = 0; s < count; ++s)
      for (int64_t g = 0; g < G; ++g)
        scores[g * ctx + n * bs + s] = dot(qf.data() + g * D, rows.data() + s * D, D) * scale;
  }
  for (int64_t g = 0; g < G; ++g) softmax_(scores.data() + g * ctx, ctx);
  for (int64_t n = 0; n < num_blocks; ++n) {
    const int64_t count = std::min(bs, ctx - n * bs);
    load_rows(vc, n, count);
    for (int64_t s = 0; s < count; ++s)
      for (int64_t g = 0; g < G; ++g) {
        const float p = scores[g * ctx + n * bs + s];
        const float* vr = rows.data() + s * D;
        float* ag = acc.data() + g * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ag[d] += p * vr[d];
      }
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d) out[(b * H + hk * G + g) * D + d] = T(acc[g * D + d]);
}

void decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                      torch::Tensor v_cache, torch::Tensor block_table,
                      torch::Tensor context_lens, double scale) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t Hkv = k_cache.size(2), bs = k_cache.size(1), max_blocks = block_table.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_attention", [&] {
    auto* o = out.data_ptr<scalar_t>();
    auto* qi = q.data_ptr<scalar_t>();
    auto* kc = k_cache.data_ptr<scalar_t>();
    auto* vc = v_cache.data_ptr<scalar_t>();
    const int64_t* bt = block_table.data_ptr<int64_t>();
    const int64_t* cl = context_lens.data_ptr<int64_t>();
    const int64_t q_row = q.stride(0);
    at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / Hkv, hk = task % Hkv;
        decode_attention_task(o, qi, q_row, kc, vc, bt + b * max_blocks, cl[b], b, hk, H, Hkv,
                              D, bs, float(scale));
      }
    });
  });
}

// ---- Linear for a few rows: streams the weight once, near memory bandwidth --------------
// out [M, N] = x [M, K] @ w[N, K]^T (+ bias). Library GEMMs are tuned for many rows; with
// one to a few rows reading the weight is all the work. bf16 rows are widened in registers.
inline float dot_row(const float* x, const float* w, int64_t n) { return dot(x, w, n); }

inline float dot_row(const float* x, const c10::BFloat16* w, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(w);
  int64_t i = 0;
  float sum = 0.f;
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  auto load = [&](int64_t at) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  };
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), load(i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), load(i + 16), acc1);
  }
  sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += x[i] * f32(w[i]);
  return sum;
}

template <typename T>
inline float dot_row(const float* x, const T* w, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * f32(w[i]);
  return sum;
}

void small_linear(torch::Tensor out, torch::Tensor x, torch::Tensor w,
                  c10::optional<torch::Tensor> bias) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, w.scalar_type(), "small_linear", [&] {
    const auto* wi = w.data_ptr<scalar_t>();
    const scalar_t* bi = bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr;
    auto* o = out.data_ptr<scalar_t>();
    std::vector<float> xf(M * K);
    widen(x.data_ptr<scalar_t>(), xf.data(), M * K);
    at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const float b = bi ? f32(bi[n]) : 0.f;
        for (int64_t m = 0; m < M; ++m)
          o[m * N + n] = scalar_t(dot_row(xf.data() + m * K, wi + n * K, K) + b);
      }
    });
  });
}

}  // namespace

void register_quant_ops(pybind11::module_& m);  // quant_ops.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm);
  m.def("add_rms_norm_", &add_rms_norm_);
  m.def("silu_and_mul", &silu_and_mul);
  m.def("rotary_", &rotary_);
  m.def("write_kv", &write_kv);
  m.def("decode_attention", &decode_attention);
  m.def("small_linear", &small_linear);
  register_quant_ops(m);
}
