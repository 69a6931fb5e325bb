// Prompt attention on the CPU: each new token attends causally over the context (a cached
// prefix, then the prompt's own tokens), flash-style in float32 whatever the element type.
// Prompts that attend in bfloat16 (`bf16_products`) take the CPU's bfloat16 dot products where
// the build has them (AVX512-BF16): q, k, the probabilities and v rounded to bfloat16 as torch's
// bfloat16 kernel rounds them, each pair of products summed into float32; the scores, softmax
// and sums stay float32. Other builds ignore the flag (float32 products).
//
// NOTE: why not torch's fused CPU kernel: prefill 256-2,048 ran 1.08-1.27x faster through this
// one on a 2-core Zen 4 (`python -m bench engine --before torch-prompt-attention`,
// docs/notes/2026-11-29-prefill.md, "Prompts attend through a native kernel"). Here a task
// is one kv head's G query heads over a block of query rows, so each block of keys is packed
// once (K transposed, V widened) for all G x kQueryRows rows, and both products run as
// register tiles of rows x vectors.
#include <ATen/core/Tensor.h>

#include "dispatch.h"
#include "kernels.h"
#include "parallel.h"
#include "simd.h"

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using simd::kWidth;
using simd::V;

constexpr int64_t kQueryRows = 32;  // query rows of one head per task
constexpr int64_t kPackBytes = int64_t(64) << 20;  // packed keys and values held at a time
constexpr int kCols = 4;            // vectors per tile row
constexpr int64_t kKeys = kCols * kWidth;  // keys per block: one tile row of scores
// Rows per register tile: rows x kCols accumulators, kCols loads and a broadcast must fit the
// registers (32 with AVX-512, 16 with AVX2).
constexpr int kTileRows = kWidth == 16 ? 6 : (kWidth == 8 ? 2 : 4);

// s[RT][kKeys] = q[RT][D] . kt[D][kKeys]
template <int RT>
inline void score_tile(float* s, const float* q, int64_t D, const float* kt) {
  V acc[RT][kCols];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < kCols; ++c) acc[r][c] = simd::zero();
  for (int64_t d = 0; d < D; ++d) {
    V k[kCols];
    for (int c = 0; c < kCols; ++c) k[c] = simd::load(kt + d * kKeys + c * kWidth);
    for (int r = 0; r < RT; ++r) {
      const V qv = simd::set1(q[r * D + d]);
      for (int c = 0; c < kCols; ++c) acc[r][c] = simd::fmadd(qv, k[c], acc[r][c]);
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < kCols; ++c) simd::store(s + r * kKeys + c * kWidth, acc[r][c]);
}

// o[RT][CV vectors] (row stride Dp) += p[RT][n] (row stride kKeys) . v[n][CV vectors] (row
// stride Dp)
template <int RT, int CV>
inline void value_tile(float* o, int64_t Dp, const float* p, const float* v, int64_t n) {
  V acc[RT][CV];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CV; ++c) acc[r][c] = simd::load(o + r * Dp + c * kWidth);
  for (int64_t j = 0; j < n; ++j) {
    V vv[CV];
    for (int c = 0; c < CV; ++c) vv[c] = simd::load(v + j * Dp + c * kWidth);
    for (int r = 0; r < RT; ++r) {
      const V pv = simd::set1(p[r * kKeys + j]);
      for (int c = 0; c < CV; ++c) acc[r][c] = simd::fmadd(pv, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CV; ++c) simd::store(o + r * Dp + c * kWidth, acc[r][c]);
}

template <int RT>
void value_tiles(float* o, int64_t Dp, const float* p, const float* v, int64_t n) {
  int64_t c = 0;
  for (; c + kCols * kWidth <= Dp; c += kCols * kWidth) value_tile<RT, kCols>(o + c, Dp, p, v + c, n);
  for (; c < Dp; c += kWidth) value_tile<RT, 1>(o + c, Dp, p, v + c, n);
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define KV_BF16_PRODUCTS 1
// The bfloat16 forms of score_tile and value_tile (kWidth 16): acc += a . b pairwise, where a
// is one pair broadcast and b 16 pairs.
inline __m512 dot_pairs(__m512 acc, uint32_t a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(static_cast<int>(a)), (__m512bh)b);
}

// s[RT][kKeys] = scale * q[RT][D / 2 pairs] . kt[D / 2][kKeys pairs]
template <int RT>
inline void score_tile_pairs(float* s, const uint32_t* q, int64_t D2, const uint32_t* kt,
                             float scale) {
  __m512 acc[RT][kCols];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D2; ++d) {
    __m512i k[kCols];
    for (int c = 0; c < kCols; ++c) k[c] = _mm512_loadu_si512(kt + d * kKeys + c * kWidth);
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < kCols; ++c) acc[r][c] = dot_pairs(acc[r][c], q[r * D2 + d], k[c]);
  }
  const __m512 sv = _mm512_set1_ps(scale);
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < kCols; ++c)
      _mm512_storeu_ps(s + r * kKeys + c * kWidth, _mm512_mul_ps(acc[r][c], sv));
}

// o[RT][CV vectors] (row stride Dp) += p[RT][n2 pairs] (row stride kKeys / 2) . v[n2][CV
// vectors of pairs] (row stride Dp)
template <int RT, int CV>
inline void value_tile_pairs(float* o, int64_t Dp, const uint32_t* p, const uint32_t* v,
                             int64_t n2) {
  __m512 acc[RT][CV];
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CV; ++c) acc[r][c] = _mm512_loadu_ps(o + r * Dp + c * kWidth);
  for (int64_t j = 0; j < n2; ++j) {
    __m512i vv[CV];
    for (int c = 0; c < CV; ++c) vv[c] = _mm512_loadu_si512(v + j * Dp + c * kWidth);
    for (int r = 0; r < RT; ++r)
      for (int c = 0; c < CV; ++c) acc[r][c] = dot_pairs(acc[r][c], p[r * kKeys / 2 + j], vv[c]);
  }
  for (int r = 0; r < RT; ++r)
    for (int c = 0; c < CV; ++c) _mm512_storeu_ps(o + r * Dp + c * kWidth, acc[r][c]);
}

template <int RT>
void value_tiles_pairs(float* o, int64_t Dp, const uint32_t* p, const uint32_t* v, int64_t n2) {
  int64_t c = 0;
  for (; c + kCols * kWidth <= Dp; c += kCols * kWidth)
    value_tile_pairs<RT, kCols>(o + c, Dp, p, v + c, n2);
  for (; c < Dp; c += kWidth) value_tile_pairs<RT, 1>(o + c, Dp, p, v + c, n2);
}

// A row's kKeys probabilities as kKeys / 2 pairs (the instruction's rounding: to nearest even).
inline void probability_pairs(uint32_t* out, const float* s) {
  for (int64_t j = 0; j < kKeys; j += 2 * kWidth) {
    const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + j + kWidth), _mm512_loadu_ps(s + j));
    _mm512_storeu_si512(out + j / 2, (__m512i)both);
  }
}
#endif

// One task's buffers, float32: rows R = G x (query rows), Dp = D rounded up to a vector; with
// bfloat16 products q and the probabilities as pairs of bfloat16 (qp, sp) instead of q.
struct Block {
  std::vector<float> q, s, o, m, l;
  std::vector<uint32_t> qp, sp;
  Block(int64_t rows, int64_t D, int64_t Dp, bool pairs)
      : q(pairs ? 0 : rows * D), s(rows * kKeys), o(rows * Dp), m(rows), l(rows),
        qp(pairs ? rows * D / 2 : 0), sp(pairs ? rows * kKeys / 2 : 0) {}
};

// Two floats rounded to bfloat16 (to nearest even, as torch's .to(torch.bfloat16)), side by
// side in 32 bits: the operand the dot instruction multiplies pairwise.
inline uint32_t pair(float lo, float hi) {
  return uint32_t(c10::BFloat16(lo).x) | (uint32_t(c10::BFloat16(hi).x) << 16);
}

// A group of kv heads' keys and values in blocks of kKeys, zero-padded, packed once for every
// query block: head h's block i has its keys transposed at keys(h, i) ([D][kKeys]) and its
// values at values(h, i) ([kKeys][Dp]). For bfloat16 products, pairs instead: keys as
// [D / 2][kKeys] pairs of dimensions, values as [kKeys / 2][Dp] pairs of keys.
struct Packed {
  std::vector<float> kt, v;
  std::vector<uint32_t> kt2, v2;
  int64_t blocks, D, Dp;
  Packed(int64_t heads, int64_t blocks, int64_t D, int64_t Dp, bool pairs)
      : blocks(blocks), D(D), Dp(Dp) {
    if (pairs) {
      kt2.resize(heads * blocks * D / 2 * kKeys);
      v2.resize(heads * blocks * kKeys / 2 * Dp);
    } else {
      kt.resize(heads * blocks * D * kKeys);
      v.resize(heads * blocks * kKeys * Dp);
    }
  }
  float* keys(int64_t h, int64_t block) { return kt.data() + (h * blocks + block) * D * kKeys; }
  float* values(int64_t h, int64_t block) { return v.data() + (h * blocks + block) * kKeys * Dp; }
  const float* keys(int64_t h, int64_t block) const { return const_cast<Packed*>(this)->keys(h, block); }
  const float* values(int64_t h, int64_t block) const { return const_cast<Packed*>(this)->values(h, block); }
  uint32_t* key_pairs(int64_t h, int64_t block) {
    return kt2.data() + (h * blocks + block) * D / 2 * kKeys;
  }
  uint32_t* value_pairs(int64_t h, int64_t block) {
    return v2.data() + (h * blocks + block) * kKeys / 2 * Dp;
  }
  const uint32_t* key_pairs(int64_t h, int64_t block) const { return const_cast<Packed*>(this)->key_pairs(h, block); }
  const uint32_t* value_pairs(int64_t h, int64_t block) const { return const_cast<Packed*>(this)->value_pairs(h, block); }
};

// Block `block` of kv head hk (the group's head h) out of L keys.
template <typename T>
void pack(Packed& p, const T* k, int64_t k_row, const T* v, int64_t v_row, int64_t hk, int64_t h,
          int64_t L, int64_t block) {
  const int64_t D = p.D, Dp = p.Dp;
  float* kt = p.keys(h, block);
  float* vb = p.values(h, block);
  std::fill(kt, kt + D * kKeys, 0.f);
  std::fill(vb, vb + kKeys * Dp, 0.f);
  for (int64_t j = 0; j < kKeys && block * kKeys + j < L; ++j) {
    const T* kj = k + (block * kKeys + j) * k_row + hk * D;
    const T* vj = v + (block * kKeys + j) * v_row + hk * D;
    for (int64_t d = 0; d < D; ++d) kt[d * kKeys + j] = static_cast<float>(kj[d]);
    int64_t d = 0;
    for (; d + kWidth <= D; d += kWidth) simd::store(vb + j * Dp + d, simd::load(vj + d));
    for (; d < D; ++d) vb[j * Dp + d] = static_cast<float>(vj[d]);
  }
}

// pack() for bfloat16 products: block `block` of kv head hk as pairs (Packed).
template <typename T>
void pack_pairs(Packed& p, const T* k, int64_t k_row, const T* v, int64_t v_row, int64_t hk,
                int64_t h, int64_t L, int64_t block) {
  const int64_t D = p.D, Dp = p.Dp, first = block * kKeys;
  const int64_t n = std::min(kKeys, L - first);
  uint32_t* kt = p.key_pairs(h, block);
  uint32_t* vb = p.value_pairs(h, block);
  std::fill(kt, kt + D / 2 * kKeys, 0u);
  std::fill(vb, vb + kKeys / 2 * Dp, 0u);
  for (int64_t j = 0; j < n; ++j) {
    const T* kj = k + (first + j) * k_row + hk * D;
    for (int64_t d = 0; d < D / 2; ++d)
      kt[d * kKeys + j] = pair(static_cast<float>(kj[2 * d]), static_cast<float>(kj[2 * d + 1]));
  }
  for (int64_t j = 0; j < n; j += 2) {
    const T* v0 = v + (first + j) * v_row + hk * D;
    const T* v1 = j + 1 < n ? v0 + v_row : nullptr;  // past the last key: zero
    for (int64_t d = 0; d < D; ++d)
      vb[j / 2 * Dp + d] = pair(static_cast<float>(v0[d]), v1 ? static_cast<float>(v1[d]) : 0.f);
  }
}

// Row r's scores (first `visible` of kKeys) -> probabilities, folding the block into its
// running max m and sum l and rescaling its output o so far.
inline void softmax_row(float* s, int64_t visible, float* m, float* l, float* o, int64_t Dp) {
  if (visible <= 0) {  // a row whose last visible key is before this block
    std::fill(s, s + kKeys, 0.f);
    return;
  }
  float top = *m;
  if (visible == kKeys) {
    V mv = simd::load(s);
    for (int64_t j = kWidth; j < kKeys; j += kWidth) mv = simd::max(mv, simd::load(s + j));
    top = std::max(top, simd::reduce_max(mv));
  } else {
    for (int64_t j = 0; j < visible; ++j) top = std::max(top, s[j]);
  }
  std::fill(s + visible, s + kKeys, -INFINITY);  // exp gives ~1e-38, taken back below
  const V topv = simd::set1(top);
  V sum = simd::zero();
  for (int64_t j = 0; j < kKeys; j += kWidth) {
    const V e = simd::exp(simd::sub(simd::load(s + j), topv));
    simd::store(s + j, e);
    sum = simd::add(sum, e);
  }
  float total = simd::reduce_add(sum);
  for (int64_t j = visible; j < kKeys; ++j) total -= s[j], s[j] = 0.f;
  if (top != *m) {
    const float alpha = *m == -INFINITY ? 0.f : simd::exp1(*m - top);
    const V av = simd::set1(alpha);
    for (int64_t d = 0; d < Dp; d += kWidth) simd::store(o + d, simd::mul(simd::load(o + d), av));
    *l *= alpha;
  }
  *l += total;
  *m = top;
}

// b.s's R rows of scores against key block `block` of the group's head h.
inline void scores(Block& b, const Packed& kv, int64_t h, int64_t block, int64_t R) {
  const int64_t D = kv.D;
  const float* kt = kv.keys(h, block);
  int64_t r = 0;
  for (; r + kTileRows <= R; r += kTileRows)
    score_tile<kTileRows>(b.s.data() + r * kKeys, b.q.data() + r * D, D, kt);
  for (; r < R; ++r) score_tile<1>(b.s.data() + r * kKeys, b.q.data() + r * D, D, kt);
}

// b.o's R rows += their probabilities in b.s times the block's first n values.
inline void values(Block& b, const Packed& kv, int64_t h, int64_t block, int64_t R, int64_t n) {
  const int64_t Dp = kv.Dp;
  const float* vb = kv.values(h, block);
  int64_t r = 0;
  for (; r + kTileRows <= R; r += kTileRows)
    value_tiles<kTileRows>(b.o.data() + r * Dp, Dp, b.s.data() + r * kKeys, vb, n);
  for (; r < R; ++r) value_tiles<1>(b.o.data() + r * Dp, Dp, b.s.data() + r * kKeys, vb, n);
}

// scores() and values() in bfloat16 products (only called where the build has them).
inline void scores_by_pairs(Block& b, const Packed& kv, int64_t h, int64_t block, int64_t R,
                            float scale) {
#if defined(KV_BF16_PRODUCTS)
  const int64_t D2 = kv.D / 2;
  const uint32_t* kt = kv.key_pairs(h, block);
  int64_t r = 0;
  for (; r + kTileRows <= R; r += kTileRows)
    score_tile_pairs<kTileRows>(b.s.data() + r * kKeys, b.qp.data() + r * D2, D2, kt, scale);
  for (; r < R; ++r) score_tile_pairs<1>(b.s.data() + r * kKeys, b.qp.data() + r * D2, D2, kt, scale);
#endif
}

inline void values_by_pairs(Block& b, const Packed& kv, int64_t h, int64_t block, int64_t R,
                            int64_t n) {
#if defined(KV_BF16_PRODUCTS)
  const int64_t Dp = kv.Dp, n2 = (n + 1) / 2, half = kKeys / 2;
  const uint32_t* vb = kv.value_pairs(h, block);
  for (int64_t r = 0; r < R; ++r) probability_pairs(b.sp.data() + r * half, b.s.data() + r * kKeys);
  int64_t r = 0;
  for (; r + kTileRows <= R; r += kTileRows)
    value_tiles_pairs<kTileRows>(b.o.data() + r * Dp, Dp, b.sp.data() + r * half, vb, n2);
  for (; r < R; ++r) value_tiles_pairs<1>(b.o.data() + r * Dp, Dp, b.sp.data() + r * half, vb, n2);
#endif
}

// Query rows [q0, q0 + nq) of kv head hk's G heads, over keys [0, offset + q0 + nq); in
// bfloat16 products where `kv` holds pairs.
template <typename T>
void attend_block(T* out, int64_t o_row, const T* q, int64_t q_row, const Packed& kv, int64_t hk,
                  int64_t h, int64_t G, int64_t q0, int64_t nq, int64_t offset, float scale,
                  Block& b) {
  const int64_t D = kv.D, Dp = kv.Dp;
  const int64_t R = G * nq, keys = offset + q0 + nq;
  const bool pairs = !kv.kt2.empty();
  for (int64_t g = 0; g < G; ++g)  // row g * nq + i: head hk * G + g, token q0 + i
    for (int64_t i = 0; i < nq; ++i) {
      const T* src = q + (q0 + i) * q_row + (hk * G + g) * D;
      const int64_t r = g * nq + i;
      if (pairs) {  // q rounded as it is; the scale applies to its scores (as torch's)
        for (int64_t d = 0; d < D / 2; ++d)
          b.qp[r * D / 2 + d] = pair(static_cast<float>(src[2 * d]), static_cast<float>(src[2 * d + 1]));
      } else {
        for (int64_t d = 0; d < D; ++d) b.q[r * D + d] = static_cast<float>(src[d]) * scale;
      }
    }
  std::fill(b.o.begin(), b.o.begin() + R * Dp, 0.f);
  std::fill(b.m.begin(), b.m.begin() + R, -INFINITY);
  std::fill(b.l.begin(), b.l.begin() + R, 0.f);
  for (int64_t k0 = 0; k0 < keys; k0 += kKeys) {
    const int64_t n = std::min(kKeys, keys - k0);
    if (pairs)
      scores_by_pairs(b, kv, h, k0 / kKeys, R, scale);
    else
      scores(b, kv, h, k0 / kKeys, R);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t last = offset + q0 + r % nq;  // the row's last visible key
      softmax_row(b.s.data() + r * kKeys, std::min(n, last - k0 + 1), &b.m[r], &b.l[r],
                  b.o.data() + r * Dp, Dp);
    }
    if (pairs)
      values_by_pairs(b, kv, h, k0 / kKeys, R, n);
    else
      values(b, kv, h, k0 / kKeys, R, n);
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t r = g * nq + i;
      const float inv = 1.f / b.l[r];
      T* dst = out + (q0 + i) * o_row + (hk * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = T(b.o[r * Dp + d] * inv);
    }
}

// Task t's query block: 0, last, 1, last - 1, ...: causal blocks grow with their index, and
// this order gives any run of tasks about the same work (parallel_for splits contiguously).
inline int64_t zigzag(int64_t t, int64_t blocks) {
  return t % 2 == 0 ? t / 2 : blocks - 1 - t / 2;
}

}  // namespace

bool kernels::prefill_attention_has_bf16_products() {
#if defined(KV_BF16_PRODUCTS)
  return true;
#else
  return false;
#endif
}

void kernels::prefill_attention(at::Tensor out, at::Tensor q, at::Tensor k, at::Tensor v,
                                double scale, bool bf16_products) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && out.sizes() == q.sizes(),
              "prefill_attention: q, out [T, H, D], k, v [L, H_kv, D]");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), L = k.size(0), Hkv = k.size(1);
  TORCH_CHECK(v.sizes() == k.sizes() && k.size(2) == D && H % Hkv == 0 && L >= T,
              "prefill_attention: ", T, " queries of ", H, " heads over ", L, " keys of ", Hkv);
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() &&
                  out.scalar_type() == q.scalar_type(),
              "prefill_attention: q, k, v and out of one dtype");
  for (const at::Tensor* t : {&out, &q, &k, &v})
    TORCH_CHECK(t->stride(2) == 1 && t->stride(1) == D,
                "prefill_attention: each row's heads contiguous");
  if (T == 0) return;
  const int64_t G = H / Hkv, Dp = (D + kWidth - 1) / kWidth * kWidth;
  const int64_t blocks = (T + kQueryRows - 1) / kQueryRows, offset = L - T;
  const int64_t key_blocks = (L + kKeys - 1) / kKeys;
  const bool pairs = bf16_products && prefill_attention_has_bf16_products() && D % 2 == 0;
  // kv heads packed at a time: all of them, unless that would take more than kPackBytes
  const int64_t element = pairs ? int64_t(sizeof(uint16_t)) : int64_t(sizeof(float));
  const int64_t head_bytes = key_blocks * kKeys * (D + Dp) * element;
  const int64_t group = std::clamp<int64_t>(kPackBytes / head_bytes, 1, Hkv);
  Packed kv(group, key_blocks, D, Dp, pairs);
  KV_DISPATCH(q.scalar_type(), "prefill_attention", [&] {
    auto* o = out.data_ptr<scalar_t>();
    const auto* qp = q.data_ptr<scalar_t>();
    for (int64_t first = 0; first < Hkv; first += group) {
      const int64_t heads = std::min(group, Hkv - first);
      kernels::parallel_for(0, heads * key_blocks, 1, [&](int64_t begin, int64_t end) {
        const auto* kp = k.data_ptr<scalar_t>();
        const auto* vp = v.data_ptr<scalar_t>();
        for (int64_t item = begin; item < end; ++item) {
          const int64_t hk = first + item / key_blocks, h = item / key_blocks;
          if (pairs)
            pack_pairs(kv, kp, k.stride(0), vp, v.stride(0), hk, h, L, item % key_blocks);
          else
            pack(kv, kp, k.stride(0), vp, v.stride(0), hk, h, L, item % key_blocks);
        }
      });
      // tasks (head, query block): a thread keeps to one head's packed keys for a run of
      // query blocks, which zigzag so that any run mixes early and late blocks alike
      kernels::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
        Block b(G * kQueryRows, D, Dp, pairs);
        for (int64_t task = begin; task < end; ++task) {
          const int64_t h = task / blocks, q0 = zigzag(task % blocks, blocks) * kQueryRows;
          attend_block(o, out.stride(0), qp, q.stride(0), kv, first + h, h, G, q0,
                       std::min(kQueryRows, T - q0), offset, float(scale), b);
        }
      });
    }
  });
}
