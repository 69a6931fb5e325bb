// Fused CPU kernels for the model's small, memory-bound steps. Each has a pure-torch
// twin in shared/model/ops.py, which is the reference the tests compare against.
#include <Python.h>  // PyEval_SaveThread: the GIL, without pybind11
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include "dispatch.h"
#include "kernels.h"
#include "parallel.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using simd::kWidth;
using simd::V;

template <typename T>
inline float f32(T v) { return static_cast<float>(v); }

// NOTE: the GIL is released only around work long enough to repay the hand-over: a kernel of
// a microsecond that gives the GIL away can wait milliseconds to get it back from a busy
// thread, while the engine thread's long kernels must not stall the asyncio loop thread.
constexpr int64_t kReleaseGilAbove = 1 << 15;  // elements read

class GilRelease {
 public:
  explicit GilRelease(int64_t elements) {
    // NOTE: a caller that already released it (decode_stack.cpp's run) keeps it released.
    if (elements > kReleaseGilAbove && PyGILState_Check()) state_ = PyEval_SaveThread();
  }
  ~GilRelease() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_ = nullptr;
};

// ---- Vector building blocks (simd.h), each with its scalar tail ------------------------
template <typename A, typename B>
inline float dot(const A* a, const B* b, int64_t n) {
  V acc0 = simd::zero(), acc1 = simd::zero();
  int64_t i = 0;
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
    acc0 = simd::fmadd(simd::load(a + i), simd::load(b + i), acc0);
    acc1 = simd::fmadd(simd::load(a + i + kWidth), simd::load(b + i + kWidth), acc1);
  }
  for (; i + kWidth <= n; i += kWidth) acc0 = simd::fmadd(simd::load(a + i), simd::load(b + i), acc0);
  float sum = simd::reduce_add(simd::add(acc0, acc1));
  for (; i < n; ++i) sum += f32(a[i]) * f32(b[i]);
  return sum;
}

// acc[0:n] += p * x[0:n]
template <typename T>
inline void axpy(float* acc, float p, const T* x, int64_t n) {
  const V pv = simd::set1(p);
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth)
    simd::store(acc + i, simd::fmadd(pv, simd::load(x + i), simd::load(acc + i)));
  for (; i < n; ++i) acc[i] += p * f32(x[i]);
}

template <typename S, typename D>
inline void convert(D* dst, const S* src, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) simd::store(dst + i, simd::load(src + i));
  for (; i < n; ++i) dst[i] = D(f32(src[i]));
}

// ---- RMSNorm ------------------------------------------------------------------------
template <typename T>
void rms_norm_row(T* out, const T* x, const T* w, int64_t n, float eps) {
  const float r = 1.f / std::sqrt(dot(x, x, n) / n + eps);
  const V rv = simd::set1(r);
  int64_t i = 0;
  // NOTE: x * r is rounded to T before the weight scales it, as the torch reference does.
  for (; i + kWidth <= n; i += kWidth)
    simd::store(out + i, simd::mul(simd::load(w + i), simd::as<T>(simd::mul(simd::load(x + i), rv))));
  for (; i < n; ++i) out[i] = T(f32(w[i]) * f32(T(f32(x[i]) * r)));
}

}  // namespace

void kernels::rms_norm(at::Tensor out, at::Tensor x, at::Tensor w, double eps) {
  const int64_t rows = x.size(0), n = x.size(1);
  GilRelease gil(rows * n);
  KV_DISPATCH(x.scalar_type(), "rms_norm", [&] {
    auto* o = out.data_ptr<scalar_t>();
    auto* xi = x.data_ptr<scalar_t>();
    auto* wi = w.data_ptr<scalar_t>();
    kernels::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) rms_norm_row(o + r * n, xi + r * n, wi, n, float(eps));
    });
  });
}

namespace {

// residual += x; x = rms_norm(residual) * w  (both in place)
template <typename T>
inline void add_(T* acc, const T* x, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) simd::store(acc + i, simd::add(simd::load(acc + i), simd::load(x + i)));
  for (; i < n; ++i) acc[i] = T(f32(x[i]) + f32(acc[i]));
}

}  // namespace

void kernels::add_rms_norm_(at::Tensor x, at::Tensor residual, at::Tensor w,
                            double eps) {
  const int64_t rows = x.size(0), n = x.size(1);
  GilRelease gil(rows * n);
  KV_DISPATCH(x.scalar_type(), "add_rms_norm", [&] {
    auto* xi = x.data_ptr<scalar_t>();
    auto* ri = residual.data_ptr<scalar_t>();
    auto* wi = w.data_ptr<scalar_t>();
    kernels::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        add_(ri + r * n, xi + r * n, n);
        rms_norm_row(xi + r * n, ri + r * n, wi, n, float(eps));
      }
    });
  });
}

namespace {

// ---- SwiGLU -------------------------------------------------------------------------
// silu(g) * u, with silu(g) rounded to T first (as torch computes silu, then the product).
template <typename T>
void silu_and_mul_row(T* out, const T* gate, const T* up, int64_t n) {
  const V one = simd::set1(1.f);
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const V g = simd::load(gate + i);
    const V s = simd::as<T>(simd::div(g, simd::add(one, simd::exp(simd::sub(simd::zero(), g)))));
    simd::store(out + i, simd::mul(s, simd::load(up + i)));
  }
  for (; i < n; ++i) {
    const float g = f32(gate[i]);
    const T s = T(g / (1.f + simd::exp1(-g)));
    out[i] = T(f32(s) * f32(up[i]));
  }
}

}  // namespace

void kernels::silu_and_mul(at::Tensor out, at::Tensor gate_up) {
  const int64_t rows = gate_up.size(0), n = out.size(1);
  GilRelease gil(rows * n * 2);
  KV_DISPATCH(out.scalar_type(), "silu_and_mul", [&] {
    auto* o = out.data_ptr<scalar_t>();
    auto* g = gate_up.data_ptr<scalar_t>();
    kernels::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) silu_and_mul_row(o + r * n, g + r * 2 * n, g + r * 2 * n + n, n);
    });
  });
}

namespace {

// ---- Rotary embedding, rotate-half layout, in place on the q and k heads of qkv ----------
template <typename T>
void rotate_head(T* x, const float* c, const float* s, int64_t half) {
  int64_t i = 0;
  for (; i + kWidth <= half; i += kWidth) {
    const V x1 = simd::load(x + i), x2 = simd::load(x + i + half);
    const V ci = simd::load(c + i), si = simd::load(s + i);
    simd::store(x + i, simd::fnmadd(x2, si, simd::mul(x1, ci)));
    simd::store(x + i + half, simd::fmadd(x1, si, simd::mul(x2, ci)));
  }
  for (; i < half; ++i) {
    const float x1 = f32(x[i]), x2 = f32(x[i + half]);
    x[i] = T(x1 * c[i] - x2 * s[i]);
    x[i + half] = T(x2 * c[i] + x1 * s[i]);
  }
}

}  // namespace

void kernels::rotary_(at::Tensor qkv, at::Tensor cos, at::Tensor sin,
                      int64_t num_heads, int64_t head_dim) {
  const int64_t tokens = qkv.size(0), row = qkv.stride(0), half = head_dim / 2;
  GilRelease gil(tokens * num_heads * head_dim);
  KV_DISPATCH(qkv.scalar_type(), "rotary", [&] {
    auto* base = qkv.data_ptr<scalar_t>();
    const float* c = cos.data_ptr<float>();
    const float* s = sin.data_ptr<float>();
    kernels::parallel_for(0, tokens, 4, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t h = 0; h < num_heads; ++h)
          rotate_head(base + t * row + h * head_dim, c + t * half, s + t * half, half);
    });
  });
}

// ---- KV write: new tokens' k and v into their cache slots --------------------------------
void kernels::write_kv(at::Tensor k, at::Tensor v, at::Tensor k_cache,
                       at::Tensor v_cache, at::Tensor slots) {
  const int64_t tokens = k.size(0), width = k.size(1) * k.size(2);
  const int64_t in_row = k.stride(0);
  GilRelease gil(tokens * width * 2);
  KV_DISPATCH(k.scalar_type(), "write_kv", [&] {
    auto* ki = k.data_ptr<scalar_t>();
    auto* vi = v.data_ptr<scalar_t>();
    auto* kc = k_cache.data_ptr<scalar_t>();
    auto* vc = v_cache.data_ptr<scalar_t>();
    const int64_t* sl = slots.data_ptr<int64_t>();
    kernels::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        std::copy(ki + t * in_row, ki + t * in_row + width, kc + sl[t] * width);
        std::copy(vi + t * in_row, vi + t * in_row + width, vc + sl[t] * width);
      }
    });
  });
}

namespace {

// x[0:n] = exp(x - max(x)); returns that max, and the sum of the new x in *sum.
inline float exp_sum_(float* x, int64_t n, float* sum) {
  V mv = simd::set1(-INFINITY);
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) mv = simd::max(mv, simd::load(x + i));
  float mx = simd::reduce_max(mv);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  const V mxv = simd::set1(mx);
  V sv = simd::zero();
  for (i = 0; i + kWidth <= n; i += kWidth) {
    const V e = simd::exp(simd::sub(simd::load(x + i), mxv));
    simd::store(x + i, e);
    sv = simd::add(sv, e);
  }
  *sum = simd::reduce_add(sv);
  for (; i < n; ++i) *sum += (x[i] = simd::exp1(x[i] - mx));
  return mx;
}

// ---- Decode attention over the paged cache: one query token per sequence -----------------
// q [B, H, D] (row stride q_row), caches [blocks, block_size, H_kv, D], out [B, H, D].
// A task is a sequence: its H query heads read each cached slot (every kv head's row) in
// place, front to back. Where the sequences are fewer than twice the threads, each context is
// cut into pieces that run apart and merge by their maxima (flash-decoding).
// NOTE: a task per (sequence, kv head) read each head's rows at a stride of the slot, each
// slot's lines fetched by three tasks apart: batches of 8-32 decoded 1.08-1.56x faster this way
// (docs/notes/2026-11-29-decode-attention.md, "Decode attention a sequence at a time").
constexpr int64_t kMinPiece = 32;  // tokens: shorter pieces cost more to merge than they save
// Tokens between a slot's prefetch and its sums (kernels::set_kv_prefetch; 0: none), or by
// default as many as make kKvPrefetchBytes. NOTE: bytes, not tokens: from memory on a Zen 4
// float32 slots ran fastest 8 ahead and bfloat16 ones 16 ahead, 6 KB either way for SmolLM2's
// (batch 1 of 128-256 tokens 1.1x as fast as 16 float32 slots ahead:
// docs/notes/2026-11-30-batch-1-decode-step.md, "Decode attention asks for 6 KB ahead").
constexpr int64_t kKvPrefetchBytes = 6144;
c10::optional<int64_t> slots_ahead;

int64_t pieces_per_task(int64_t tasks, int64_t threads, int64_t max_ctx) {
  if (tasks >= 2 * threads) return 1;
  const int64_t wanted = (2 * threads + tasks - 1) / tasks;
  return std::max<int64_t>(1, std::min(wanted, max_ctx / kMinPiece));
}

// One piece's partial result per query head h: the max score m[h], the sum l[h] of
// exp(score - m[h]) and acc[h] = the sum of those weights times the values (l = 0: empty).
struct Partial {
  float* m;
  float* l;
  float* acc;
};

// Tokens a value pass sums before the next pass (a slot row of SmolLM2's 3 kv heads of 64
// bfloat16s is 384 bytes: a run 12 KB, in L1).
constexpr int64_t kValueRun = 32;

// One pass of a piece's value sums: `run` tokens' scores (`scores`, a head's n apart) times
// each token's values from `at` within its slot row, added into `acc` (a head's D apart).
struct ValuePass {
  int64_t at;
  const float* scores;
  int64_t n, run;
  float* acc;
  int64_t D;
};

// How many query heads of a kv head's group, and vectors of their head size, a pass keeps in
// registers (heads 0: the size is no whole number of vectors, so no pass).
struct Tile {
  int heads, vectors;
};

inline Tile tile_of(int64_t G, int64_t D) {
  if (D % kWidth != 0) return {0, 0};
  const int64_t vectors = D / kWidth;
  // NOTE: at most 12 accumulators, for AVX2's 16 registers (a pass there ran faster too)
  const int heads = G % 4 == 0 ? 4 : G % 3 == 0 ? 3 : G % 2 == 0 ? 2 : 1;
  for (int v : {4, 2, 1})
    if (vectors % v == 0 && heads * v <= 12) return {heads, v};
  return {heads, 1};
}

template <int kHeads, int kVectors, class Slot>
void sum_values_tiled(const ValuePass& p, const Slot& slot) {
  V acc[kHeads][kVectors];
  for (int i = 0; i < kHeads; ++i)
    for (int j = 0; j < kVectors; ++j) acc[i][j] = simd::load(p.acc + i * p.D + j * kWidth);
  for (int64_t k = 0; k < p.run; ++k) {
    const auto* v = slot(k) + p.at;
    V values[kVectors];
    for (int j = 0; j < kVectors; ++j) values[j] = simd::load(v + j * kWidth);
    for (int i = 0; i < kHeads; ++i) {
      const V pv = simd::set1(p.scores[i * p.n + k]);
      for (int j = 0; j < kVectors; ++j) acc[i][j] = simd::fmadd(pv, values[j], acc[i][j]);
    }
  }
  for (int i = 0; i < kHeads; ++i)
    for (int j = 0; j < kVectors; ++j) simd::store(p.acc + i * p.D + j * kWidth, acc[i][j]);
}

template <int kHeads, class Slot>
void sum_values_heads(int vectors, const ValuePass& p, const Slot& slot) {
  if (vectors == 4) return sum_values_tiled<kHeads, 4>(p, slot);
  if (vectors == 2) return sum_values_tiled<kHeads, 2>(p, slot);
  sum_values_tiled<kHeads, 1>(p, slot);
}

template <class Slot>
void sum_values(Tile tile, const ValuePass& p, const Slot& slot) {
  switch (tile.heads) {
    case 4: return sum_values_heads<4>(tile.vectors, p, slot);
    case 3: return sum_values_heads<3>(tile.vectors, p, slot);
    case 2: return sum_values_heads<2>(tile.vectors, p, slot);
    default: return sum_values_heads<1>(tile.vectors, p, slot);
  }
}

// Tokens [t0, t1) of one sequence (q: its [H, D] row; table: its blocks) into `part`.
template <typename T>
void attend_piece(const T* q, const T* kc, const T* vc, const int64_t* table, int64_t t0,
                  int64_t t1, int64_t H, int64_t Hkv, int64_t D, int64_t bs, float scale,
                  Partial part) {
  const int64_t G = H / Hkv, n = t1 - t0;
  std::fill(part.acc, part.acc + H * D, 0.f);
  std::fill(part.l, part.l + H, 0.f);
  std::fill(part.m, part.m + H, -INFINITY);
  if (n <= 0) return;
  std::vector<float> qf(H * D), scores(H * n);
  convert(qf.data(), q, H * D);
  auto slot = [&](const T* cache, int64_t t) {  // token t's row of every kv head
    return cache + (table[t / bs] * bs + t % bs) * Hkv * D;
  };
  // NOTE: a context's slots lie in blocks scattered over the pool, where the hardware
  // prefetcher did not run ahead: each token asks for the slot `distance` tokens on, into L2
  // (simd::prefetch). From memory the kernel ran 1.3-2.0x as fast on a Zen 4, decode batches
  // of 8-32 1.08-1.23x (docs/notes/2026-11-29-decode-attention.md, "Decode attention asks for its slots ahead").
  const int64_t slot_bytes = Hkv * D * int64_t(sizeof(T));
  const int64_t distance = slots_ahead.value_or((kKvPrefetchBytes + slot_bytes - 1) / slot_bytes);
  auto ahead = [&](const T* cache, int64_t t) {
    if (distance > 0 && t + distance < t1) simd::prefetch(slot(cache, t + distance), slot_bytes);
  };
  for (int64_t t = t0; t < std::min(t0 + distance, t1); ++t) simd::prefetch(slot(kc, t), slot_bytes);
  int64_t t = t0;
  // NOTE: 16-bit caches take kWidth tokens at once, each head's kWidth sums reduced together
  // (simd::sum_lanes), where a reduction a dot product kept the kernel compute-bound (bfloat16
  // from memory 1.13-1.19x as fast on a Zen 4). Not float32, which memory bounds: reading
  // kWidth rows a kv head at a time was 0.7-0.9x as fast as a row at a time (`python -m bench
  // decode-attention`: docs/notes/2026-11-29-decode-attention.md, "Decode attention sums 16 tokens at once").
  if (!std::is_same_v<T, float> && D % kWidth == 0) {
    for (; t + kWidth <= t1; t += kWidth) {
      const T* k[kWidth];
      for (int64_t i = 0; i < kWidth; ++i) ahead(kc, t + i), k[i] = slot(kc, t + i);
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = qf.data() + h * D;
        const int64_t at = h / G * D;
        V sums[kWidth];
        for (int64_t i = 0; i < kWidth; ++i) sums[i] = simd::zero();
        for (int64_t d = 0; d < D; d += kWidth) {
          const V qv = simd::load(qh + d);
          for (int64_t i = 0; i < kWidth; ++i) sums[i] = simd::fmadd(qv, simd::load(k[i] + at + d), sums[i]);
        }
        simd::store(scores.data() + h * n + t - t0, simd::mul(simd::sum_lanes(sums), simd::set1(scale)));
      }
    }
  }
  for (; t < t1; ++t) {
    ahead(kc, t);
    const T* k = slot(kc, t);
    for (int64_t h = 0; h < H; ++h)
      scores[h * n + t - t0] = dot(qf.data() + h * D, k + h / G * D, D) * scale;
  }
  for (int64_t h = 0; h < H; ++h) part.m[h] = exp_sum_(scores.data() + h * n, n, part.l + h);
  for (int64_t t = t0; t < std::min(t0 + distance, t1); ++t) simd::prefetch(slot(vc, t), slot_bytes);
  const Tile tile = tile_of(G, D);
  if (std::is_same_v<T, float> || tile.heads == 0) {  // float32, or no whole vectors a head
    for (int64_t t = t0; t < t1; ++t) {
      ahead(vc, t);
      const T* v = slot(vc, t);
      for (int64_t h = 0; h < H; ++h) axpy(part.acc + h * D, scores[h * n + t - t0], v + h / G * D, D);
    }
    return;
  }
  // NOTE: 16-bit caches: each pass sums `tile.heads` query heads' `tile.vectors` vectors in
  // registers over a run of kValueRun tokens, where a token's axpy per head loaded and stored
  // each head's sums (with float32 caches a third of batch-1 decode attention's samples in
  // perf on a Zen 4). A run's rows stay in L1 for its passes. Each lane still adds its tokens
  // in order, one fused multiply-add each: the same floats. bfloat16 from memory 1.03-1.19x
  // as fast (both builds); float32 caches, which their reads bound, ran slower at batch 8
  // that way and keep the axpy (docs/notes/2026-11-30-batch-1-decode-step.md, "Decode attention sums values in
  // registers").
  for (int64_t r = 0; r < n; r += kValueRun) {
    const int64_t run = std::min(kValueRun, n - r);
    bool first = true;
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t h = g * G; h < (g + 1) * G; h += tile.heads)
        for (int64_t d = 0; d < D; d += tile.vectors * kWidth, first = false) {
          float* acc = part.acc + h * D + d;
          const ValuePass pass{g * D + d, scores.data() + h * n + r, n, run, acc, D};
          sum_values(tile, pass, [&](int64_t k) {
            if (first) ahead(vc, t0 + r + k);
            return slot(vc, t0 + r + k);
          });
        }
  }
}

// out [G, D] of G heads = their pieces' partials merged: each rescaled to the largest max.
template <typename T>
void merge_pieces(T* out, const float* m, const float* l, const float* acc, int64_t pieces,
                  int64_t G, int64_t D) {
  std::vector<float> row(D);
  for (int64_t g = 0; g < G; ++g) {
    float top = -INFINITY, total = 0.f;
    for (int64_t p = 0; p < pieces; ++p)
      if (l[p * G + g] > 0.f) top = std::max(top, m[p * G + g]);
    std::fill(row.begin(), row.end(), 0.f);
    for (int64_t p = 0; p < pieces; ++p) {
      if (l[p * G + g] <= 0.f) continue;
      const float w = pieces == 1 ? 1.f : simd::exp1(m[p * G + g] - top);
      total += w * l[p * G + g];
      axpy(row.data(), w, acc + (p * G + g) * D, D);
    }
    const V inv = simd::set1(1.f / total);
    int64_t i = 0;
    for (; i + kWidth <= D; i += kWidth) simd::store(row.data() + i, simd::mul(simd::load(row.data() + i), inv));
    for (; i < D; ++i) row[i] *= 1.f / total;
    convert(out + g * D, row.data(), D);
  }
}

}  // namespace

c10::optional<int64_t> kernels::set_kv_prefetch(c10::optional<int64_t> tokens) {
  TORCH_CHECK(!tokens || *tokens >= 0,
              "decode attention's prefetch distance must be 0 or more tokens (or None)");
  return std::exchange(slots_ahead, tokens);
}

void kernels::decode_attention(at::Tensor out, at::Tensor q, at::Tensor k_cache,
                               at::Tensor v_cache, at::Tensor block_table,
                               at::Tensor context_lens, double scale) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t Hkv = k_cache.size(2), bs = k_cache.size(1), max_blocks = block_table.size(1);
  TORCH_CHECK(H % Hkv == 0, "decode_attention: ", H, " heads over ", Hkv, " kv heads");
  const int64_t* cl = context_lens.data_ptr<int64_t>();
  int64_t total_ctx = 0, max_ctx = 0;
  for (int64_t b = 0; b < B; ++b) total_ctx += cl[b], max_ctx = std::max(max_ctx, cl[b]);
  GilRelease gil(total_ctx * Hkv * D * 2);
  const int64_t pieces = pieces_per_task(B, kernels::num_threads(), max_ctx);
  // partials, piece-major within a sequence: m and l [B, pieces, H], acc [B, pieces, H, D]
  std::vector<float> m(B * pieces * H), l(B * pieces * H), acc(B * pieces * H * D);
  KV_DISPATCH(q.scalar_type(), "decode_attention", [&] {
    auto* o = out.data_ptr<scalar_t>();
    auto* qi = q.data_ptr<scalar_t>();
    auto* kc = k_cache.data_ptr<scalar_t>();
    auto* vc = v_cache.data_ptr<scalar_t>();
    const int64_t* bt = block_table.data_ptr<int64_t>();
    const int64_t q_row = q.stride(0);
    kernels::parallel_for(0, B * pieces, 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / pieces, p = item % pieces, ctx = cl[b];
        const Partial part{m.data() + item * H, l.data() + item * H, acc.data() + item * H * D};
        attend_piece(qi + b * q_row, kc, vc, bt + b * max_blocks, ctx * p / pieces,
                     ctx * (p + 1) / pieces, H, Hkv, D, bs, float(scale), part);
        if (pieces == 1) merge_pieces(o + b * H * D, part.m, part.l, part.acc, 1, H, D);
      }
    });
    // NOTE: a few sequences' merges: shorter than another loop's fork and join
    for (int64_t b = 0; pieces > 1 && b < B; ++b) {
      const int64_t at = b * pieces * H;
      merge_pieces(o + b * H * D, m.data() + at, l.data() + at, acc.data() + at * D, pieces,
                   H, D);
    }
  });
}

namespace {

// ---- Linear for a few rows: streams the weight once, near memory bandwidth --------------
// out [M, N] = x [M, K] @ w[N, K]^T (+ bias). Library GEMMs are tuned for many rows; with
// one to a few rows reading the weight is all the work. Each weight row is loaded once per
// R rows of x (widened in registers when bf16 or fp16) and dotted with all R of them.
template <int R, typename T>
inline void dot_rows(float* sums, const float* x, int64_t K, const T* w) {
  constexpr int U = R == 1 ? 4 : 2;  // independent accumulators per row hide FMA latency
  V acc[R][U];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < U; ++u) acc[r][u] = simd::zero();
  int64_t i = 0;
  for (; i + U * kWidth <= K; i += U * kWidth)
    for (int u = 0; u < U; ++u) {
      const V wv = simd::load(w + i + u * kWidth);
      for (int r = 0; r < R; ++r) acc[r][u] = simd::fmadd(simd::load(x + r * K + i + u * kWidth), wv, acc[r][u]);
    }
  for (; i + kWidth <= K; i += kWidth) {
    const V wv = simd::load(w + i);
    for (int r = 0; r < R; ++r) acc[r][0] = simd::fmadd(simd::load(x + r * K + i), wv, acc[r][0]);
  }
  for (int r = 0; r < R; ++r) {
    for (int u = 1; u < U; ++u) acc[r][0] = simd::add(acc[r][0], acc[r][u]);
    sums[r] = simd::reduce_add(acc[r][0]);
  }
  for (; i < K; ++i) {
    const float wi = f32(w[i]);
    for (int r = 0; r < R; ++r) sums[r] += x[r * K + i] * wi;
  }
}

template <typename T>
void linear_rows(T* out, const float* x, int64_t M, int64_t K, const T* w, const T* bias,
                 int64_t N, int64_t begin, int64_t end) {
  float sums[4];
  for (int64_t n = begin; n < end; ++n) {
    const float b = bias ? f32(bias[n]) : 0.f;
    const T* wn = w + n * K;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) {
      dot_rows<4>(sums, x + m * K, K, wn);
      for (int r = 0; r < 4; ++r) out[(m + r) * N + n] = T(sums[r] + b);
    }
    for (; m + 2 <= M; m += 2) {
      dot_rows<2>(sums, x + m * K, K, wn);
      for (int r = 0; r < 2; ++r) out[(m + r) * N + n] = T(sums[r] + b);
    }
    for (; m < M; ++m) {
      dot_rows<1>(sums, x + m * K, K, wn);
      out[m * N + n] = T(sums[0] + b);
    }
  }
}

}  // namespace

void kernels::small_linear(at::Tensor out, at::Tensor x, at::Tensor w,
                           c10::optional<at::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "small_linear: x ",
              x.sizes(), " and weight ", w.sizes(), " do not match");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && out.is_contiguous(),
              "small_linear: x, weight and out must be contiguous");
  TORCH_CHECK(x.scalar_type() == w.scalar_type() && out.scalar_type() == w.scalar_type(),
              "small_linear: x, weight and out must share a dtype");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(out.size(0) == M && out.size(1) == N, "small_linear: out is ", out.sizes());
  GilRelease gil(N * K);
  KV_DISPATCH(w.scalar_type(), "small_linear", [&] {
    const auto* wi = w.data_ptr<scalar_t>();
    const scalar_t* bi = bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr;
    auto* o = out.data_ptr<scalar_t>();
    std::vector<float> widened;
    const float* xf;
    if constexpr (std::is_same_v<scalar_t, float>) {
      xf = x.data_ptr<float>();
    } else {
      widened.resize(M * K);
      convert(widened.data(), x.data_ptr<scalar_t>(), M * K);
      xf = widened.data();
    }
    // NOTE: memory-bound, so threads split the weight's rows: chunks of about 64 KiB each.
    const int64_t grain = std::max<int64_t>(1, (64 << 10) / (K * int64_t(sizeof(scalar_t))));
    kernels::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
      linear_rows(o, xf, M, K, wi, bi, N, begin, end);
    });
  });
}
