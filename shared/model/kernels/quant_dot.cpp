// GEMV on GGUF blocks with integer activations: 8 bits as llama.cpp computes it, or 16. Each
// row of x is quantized once per call to blocks of 32 integers qx (int8 or int16) with a
// float scale dx (and sx = dx * sum(qx)); every weight block of 32 values d * q + offset is
// then one integer dot product:  sum(w * x) ~= d * dx * sum(q * qx) + offset * sx
//   Q8_0: q signed, offset 0    Q4_0: q in 0..15, offset -8 d    Q4_1: offset m
//   Q5_0: q in 0..31, offset -16 d
//   Q4_K: each of its 8 sub-blocks of 32 is such a block, scale d * sc, offset -dmin * mn
// Paths: GGUF's rows one block a 256-bit vector (8 bits through AVX512-VNNI's
// _mm256_dpbusd_epi32 where the build has it, else AVX2's _mm256_maddubs_epi16 +
// _mm256_madd_epi16; 16 bits through _mm256_madd_epi16 on the weights widened to 16 bits);
// rows interleaved 8 at a time (quant_x8.h), a lane a row: byte dot products (group_bytes:
// Q4 formats on 8- and 16-bit x, Q8_0 on 8-bit x) or 16-bit pairs (group_x8: Q8_0 on 16-bit
// x); and a portable scalar path that every build carries (`portable=true` runs it: the
// reference).
//
// NOTE: products of integers are exact and the integer sums cannot overflow (maddubs pairs
// stay under 2 * 128 * 127; a 16-bit lane's four products under 4 * 128 * 32767), so the paths
// differ only in the order of float sums. The cost against float activations is x's rounding:
// to 8 bits (llama.cpp's own choice; greedy tokens drift) or to 16, finer than bfloat16's 8 bits
// of mantissa, where the widening and multiplying of 32 floats a block (the float GEMV) costs
// a core more than memory gives it (docs/notes/2026-11-28-avx2-only-cpu.md, "An AVX2-only CPU").
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "parallel.h"
#include "quant_blocks.h"
#include "quant_x8.h"
#include "simd.h"

namespace {

using namespace quant_blocks;

// kernels::set_gemv_x16: where the build has AVX-512, group_x16 (else group_x8 alone)
std::atomic<bool> x16_enabled{true};

// Rows of x up to which a thread quantizes into buffers it keeps (a decode step's most)
constexpr int64_t kKeptRows = 16;

// x [M, K] as integer blocks (T: int8_t or int16_t): q [M, K]; per block b of 32: d and
// s = d * sum(q), side by side in ds [M, K / 32, 2] (the SIMD path loads both at once), and
// sum(q) itself in sums [M, K / 32] (the byte kernels' exact correction for biased weights).
template <class T>
struct QRows {
  int64_t M = 0, K = 0;
  std::vector<T> q;
  std::vector<float> ds;
  std::vector<int32_t> sums;

  int64_t blocks() const { return K / 32; }
  float d(int64_t b) const { return ds[2 * b]; }
  float s(int64_t b) const { return ds[2 * b + 1]; }
};

// 16-bit x's bytes for the byte kernels, x = 256 * hi + lo (Bytes16 fills them)
struct ByteSplit {
  std::vector<uint8_t> lo;
  std::vector<int8_t> hi;
};

// What a GEMV makes of x: its integers, and their bytes where a byte kernel takes 16-bit x
template <class T>
struct XBuffers {
  QRows<T> rows;
  ByteSplit bytes;
};

// The largest |v[i]| of a block of 32 (a NaN among them skipped, as std::max skips it: its
// row's scales are then made NaN, quantize_into).
inline float largest_magnitude(const float* v) {
  simd::V top = simd::zero();
  for (int i = 0; i < 32; i += simd::kWidth) {
    const simd::V a = simd::load(v + i);
    // NOTE: top second: where |v| is NaN, an x86 max gives its second operand
    top = simd::max(simd::max(a, simd::sub(simd::zero(), a)), top);
  }
  return simd::reduce_max(top);
}

// Whether v[0..K) holds a NaN or an infinity (K a multiple of 32): v * 0 is 0 for the rest.
inline bool holds_nan(const float* v, int64_t K) {
  simd::V probe = simd::zero();
  for (int64_t i = 0; i < K; i += simd::kWidth)
    probe = simd::add(probe, simd::mul(simd::load(v + i), simd::zero()));
  return std::isnan(simd::reduce_add(probe));
}

// NOTE: the largest |q| is 127 or 32767 (symmetric): quant.py's round_activations rounds
// prefill's rows the same way. Vector ops where they give the scalar ops' floats (a product
// and a rounding each, NaN skipped in the maximum): a decode step quantizes x before each of
// its ~120 GEMVs on one thread while the others wait. Into `r`'s vectors, grown as needed
// and reused (a thread's GEMVs keep one XBuffers: gemv_rows_of), the integers stored by
// vector, where 3 vectors were allocated a call and each value converted alone: the byte
// kernels' GEMVs of a layer 2-4% faster in cache (docs/notes/2026-11-30-batch-1-decode-step.md, "x quantized without
// allocations").
template <class T>
void quantize_into(QRows<T>& r, const float* x, int64_t M, int64_t K) {
  constexpr float kLevels = std::is_same_v<T, int8_t> ? 127.f : 32767.f;
  const int64_t n = M * K / 32;
  r.M = M, r.K = K;
  r.q.resize(M * K), r.ds.resize(2 * n), r.sums.resize(n);
  for (int64_t b = 0; b < n; ++b) {
    const float* v = x + 32 * b;
    const float amax = largest_magnitude(v);
    const float d = amax / kLevels, inverse = d > 0.f ? 1.f / d : 0.f;
    T* q = r.q.data() + 32 * b;
    // v * inverse rounded to the nearest integer (even ties), each in range of T
    for (int i = 0; i < 32; i += simd::kWidth)
      simd::store_int(q + i, simd::round(simd::mul(simd::load(v + i), simd::set1(inverse))));
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += q[i];
    r.ds[2 * b] = d;
    r.ds[2 * b + 1] = d * static_cast<float>(sum);
    r.sums[b] = sum;
  }
  // NOTE: the maximum skips a NaN, and rounding makes some integer of a NaN or an infinity:
  // a row of x holding one gave finite outputs, and the sampler picked tokens from garbage.
  // Its scales are made NaN instead, so its outputs are NaN as a float GEMV's would be and
  // the engine ends the request with the sampler's error.
  const int64_t blocks = K / 32;
  for (int64_t m = 0; m < M; ++m)
    if (holds_nan(x + m * K, K))
      std::fill(r.ds.begin() + 2 * m * blocks, r.ds.begin() + 2 * (m + 1) * blocks, NAN);
}

template <class T>
QRows<T> quantize_rows(const float* x, int64_t M, int64_t K) {
  QRows<T> r;
  quantize_into(r, x, M, K);
  return r;
}

#if defined(__AVX2__)
// [d, offset, 0, 0] of sub-block j of block b, from the format's scalars.
template <class F>
inline __m128 pair_of(const uint8_t* b, int j) {
  float d, o;
  F::scale_offset(b, j, &d, &o);
  return _mm_setr_ps(d, o, 0.f, 0.f);
}
#endif

#if defined(__AVX2__)
inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
// A block's 32 quants as 16-bit lanes, for 16-bit x: values 0-15, then 16-31.
struct Quants16 {
  __m256i lo, hi;
};
// The low nibbles of 16 bytes, each in a 16-bit lane.
inline __m256i widen_nibbles16(__m128i bytes) {
  return _mm256_cvtepu8_epi16(_mm_and_si128(bytes, _mm_set1_epi8(0x0F)));
}
#endif

// ---- Formats: block j of 32 values within a row: scale, offset, quant i (and, with SIMD,
// all 32 quants in order in one vector) ---------------------------------------------------
struct Q8_0 {
  static constexpr int64_t kSubs = 1, kBytes = 34;
  static constexpr bool kSigned = true, kHasOffset = false;
  static void scale_offset(const uint8_t* b, int, float* d, float* o) {
    *d = half_to_float(b);
    *o = 0.f;
  }
  static int value(const uint8_t* b, int, int i) { return static_cast<int8_t>(b[2 + i]); }
#if defined(__AVX2__)
  static __m128 scale_offset_pair(const uint8_t* b, int) { return _mm_set_ss(half_to_float(b)); }
  static __m256i quants(const uint8_t* b, int) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  }
  static Quants16 quants16(const uint8_t* b, int) {
    return {_mm256_cvtepi8_epi16(load16(b + 2)), _mm256_cvtepi8_epi16(load16(b + 18))};
  }
#endif
};

template <bool kHasMin>
struct Q4 {  // Q4_0 and Q4_1: value i in the low nibble of byte i, value i + 16 in its high one
  static constexpr int64_t kSubs = 1, kBytes = kHasMin ? 20 : 18, kQuants = kHasMin ? 4 : 2;
  static constexpr bool kSigned = false, kHasOffset = true;
  static void scale_offset(const uint8_t* b, int, float* d, float* o) {
    q4_scale_offset<kHasMin>(b, d, o);
  }
  static int value(const uint8_t* b, int, int i) {
    return i < 16 ? b[kQuants + i] & 0x0F : b[kQuants + i - 16] >> 4;
  }
#if defined(__AVX2__)
  static __m128 scale_offset_pair(const uint8_t* b, int sub) {
#if defined(__F16C__)
    if constexpr (kHasMin) return q4_1_scale_min(b);
#endif
    return pair_of<Q4>(b, sub);
  }
  static __m256i quants(const uint8_t* b, int) {
    // NOTE: the 16 bytes loaded into both halves at once, the high half shifted by 4: no
    // shuffle (inserting a shifted copy took the one port that also broadcasts the scale).
    const __m256i both = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQuants)));
    const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
  }
  static Quants16 quants16(const uint8_t* b, int) {
    const __m128i raw = load16(b + kQuants);
    return {widen_nibbles16(raw), widen_nibbles16(_mm_srli_epi16(raw, 4))};
  }
#endif
};

struct Q5_0 {  // Q4_0's nibbles with a fifth bit each (quant_blocks.h)
  static constexpr int64_t kSubs = 1, kBytes = 22;
  static constexpr bool kSigned = false, kHasOffset = true;
  static void scale_offset(const uint8_t* b, int, float* d, float* o) {
    *d = half_to_float(b);
    *o = -16.f * *d;
  }
  static int value(const uint8_t* b, int, int i) { return q5_0_value(b, i); }
#if defined(__AVX2__)
  static __m128 scale_offset_pair(const uint8_t* b, int sub) { return pair_of<Q5_0>(b, sub); }
  static __m256i quants(const uint8_t* b, int) {
    __m128i lo, hi;
    q5_0_quants(b, &lo, &hi);
    return _mm256_set_m128i(hi, lo);
  }
  static Quants16 quants16(const uint8_t* b, int) {
    __m128i lo, hi;
    q5_0_quants(b, &lo, &hi);
    return {_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi)};
  }
#endif
};

struct Q4_K {  // sub-block j: the low (j even) or high nibbles of the 32 bytes of chunk j / 2
  static constexpr int64_t kSubs = 8, kBytes = 144;
  static constexpr bool kSigned = false, kHasOffset = true;
  static void scale_offset(const uint8_t* b, int j, float* d, float* o) {
    int sc, mn;
    q4k_scale_min(b + 4, j, &sc, &mn);
    *d = half_to_float(b) * sc;
    *o = -half_to_float(b + 2) * mn;
  }
  static int value(const uint8_t* b, int j, int i) {
    return (b[16 + 32 * (j / 2) + i] >> (4 * (j % 2))) & 0x0F;
  }
#if defined(__AVX2__)
  static __m128 scale_offset_pair(const uint8_t* b, int j) { return pair_of<Q4_K>(b, j); }
  static __m256i quants(const uint8_t* b, int j) {
    const __m256i t = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * (j / 2)));
    const __m256i shifted = _mm256_srl_epi16(t, _mm_cvtsi32_si128(4 * (j % 2)));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
  }
  static Quants16 quants16(const uint8_t* b, int j) {
    const uint8_t* chunk = b + 16 + 32 * (j / 2);
    const __m128i shift = _mm_cvtsi32_si128(4 * (j % 2));
    return {widen_nibbles16(_mm_srl_epi16(load16(chunk), shift)),
            widen_nibbles16(_mm_srl_epi16(load16(chunk + 16), shift))};
  }
#endif
};

template <class F>
inline const uint8_t* block_of(const uint8_t* row, int64_t j) {
  return row + (j / F::kSubs) * F::kBytes;
}

// ---- Portable: one output at a time, plain integer loops ---------------------------------
// NOTE: GCC 12 with -march=native (AVX512-VNNI) vectorizes the signed x signed byte loop below
// into vpdpbusd, which reads one side as unsigned: wrong sums for Q8_0. The reference path
// stays scalar.
#if defined(__GNUC__) && !defined(__clang__)
#define KV_NO_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#else
#define KV_NO_VECTORIZE
#endif

template <class F, class T>
KV_NO_VECTORIZE float dot_portable(const uint8_t* row, const QRows<T>& x, int64_t m) {
  const int64_t blocks = x.blocks();
  float sum = 0.f;
  for (int64_t j = 0; j < blocks; ++j) {
    const uint8_t* b = block_of<F>(row, j);
    const int sub = static_cast<int>(j % F::kSubs);
    const T* qx = x.q.data() + m * x.K + 32 * j;
    int32_t dot = 0;
    for (int i = 0; i < 32; ++i) dot += F::value(b, sub, i) * qx[i];
    float d, o;
    F::scale_offset(b, sub, &d, &o);
    sum += d * x.d(m * blocks + j) * static_cast<float>(dot) + o * x.s(m * blocks + j);
  }
  return sum;
}

template <class F, class T>
void rows_portable(const uint8_t* w, int64_t row_bytes, const QRows<T>& x, const float* bias,
                   float* out, int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < x.M; ++m)
      out[m * N + n] = dot_portable<F>(w + n * row_bytes, x, m) + (bias ? bias[n] : 0.f);
}

// ---- SIMD: int32 lanes, each the sum of 4 products of an unsigned and a signed byte -------
// NOTE: 256 bits on AVX-512 machines too (interleaved rows aside: group_x16). The 512-bit
// form (two blocks a vector) spent more on putting the pair's quants and scales into one
// register than the wider dot product saved: one decode row ran 10-20% slower on a Sapphire
// Rapids (python -m bench gemv --layers 1).
#if defined(__AVX2__) && defined(__FMA__)
using IV = __m256i;
using FV = __m256;
inline IV dot_u8s8(IV u, IV s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
inline IV dot_s8s8(IV a, IV b) { return dot_u8s8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)); }
inline FV fzero() { return _mm256_setzero_ps(); }
inline float fsum(FV v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline IV load_x(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// A block's quants, loaded once for all rows of x: 32 bytes for 8-bit x, 16-bit lanes for 16.
template <class F, class T>
inline auto block_quants(const uint8_t* block, int sub) {
  if constexpr (std::is_same_v<T, int16_t>) return F::quants16(block, sub);
  else return F::quants(block, sub);
}
// Those quants times 32 values of x: int32 lanes, each the sum of 4 products.
template <class F>
inline IV dot_q(IV q, const int8_t* x) {
  return F::kSigned ? dot_s8s8(q, load_x(x)) : dot_u8s8(q, load_x(x));
}
template <class F>
inline IV dot_q(const Quants16& q, const int16_t* x) {
  const IV lo = _mm256_madd_epi16(q.lo, load_x(x));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(lo, q.hi, load_x(x + 16));  // the high half's madd and the add
#else
  return _mm256_add_epi32(lo, _mm256_madd_epi16(q.hi, load_x(x + 16)));
#endif
}
#define KV_DOT_SIMD 1
#endif

#if defined(KV_DOT_SIMD)
// Block j of one weight row against M rows of x from row m0.
template <class F, int M, class T>
inline void step(const uint8_t* row, int64_t j, const QRows<T>& x, int64_t m0, FV* acc,
                 __m128* sacc) {
  const int64_t blocks = x.blocks();
  const uint8_t* block = block_of<F>(row, j);
  const int sub = static_cast<int>(j % F::kSubs);
  // [d, offset] of the block times [dx, sx] of x's: both products in one multiply
  const __m128 scale_offset = F::scale_offset_pair(block, sub);
  const auto q = block_quants<F, T>(block, sub);
  for (int m = 0; m < M; ++m) {
    const int64_t b = (m0 + m) * blocks + j;
    const IV p = dot_q<F>(q, x.q.data() + (m0 + m) * x.K + 32 * j);
    const __m128 xds = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(&x.ds[2 * b])));
    const __m128 products = _mm_mul_ps(scale_offset, xds);
    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(products), acc[m]);
    // NOTE: offset * sx fused into its sum (lane 1), as the scalar form rounded it: an
    // unfused product moved q8 prefill off the GEMV's rounding (test_quant_model.py).
    if constexpr (F::kHasOffset) sacc[m] = _mm_fmadd_ps(scale_offset, xds, sacc[m]);
  }
}

// out[m, n] for weight rows n in [n0, n1) and M rows of x from row m0.
template <class F, int M, class T>
void rows_simd(const uint8_t* w, int64_t row_bytes, const QRows<T>& x, int64_t m0,
               const float* bias, float* out, int64_t N, int64_t n0, int64_t n1) {
  const int64_t blocks = x.blocks();
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    prefetch_row(row, row_bytes);
    // NOTE: even and odd blocks add into sums of their own, as in the float GEMV: one chain
    // made every block wait on the previous one's FMA.
    FV even[M], odd[M];
    __m128 even_offsets[M], odd_offsets[M];  // lane 1: the sum of offset * sx
    for (int m = 0; m < M; ++m) {
      even[m] = odd[m] = fzero();
      even_offsets[m] = odd_offsets[m] = _mm_setzero_ps();
    }
    int64_t j = 0;
    for (; j + 1 < blocks; j += 2) {
      step<F, M>(row, j, x, m0, even, even_offsets);
      step<F, M>(row, j + 1, x, m0, odd, odd_offsets);
    }
    if (j < blocks) step<F, M>(row, j, x, m0, even, even_offsets);
    const float b = bias ? bias[n] : 0.f;
    for (int m = 0; m < M; ++m) {
      const __m128 both = _mm_add_ps(even_offsets[m], odd_offsets[m]);
      const float offsets = _mm_cvtss_f32(_mm_movehdup_ps(both));
      out[(m0 + m) * N + n] = fsum(_mm256_add_ps(even[m], odd[m])) + offsets + b;
    }
  }
}

template <class F, class T>
void rows_simd_all(const uint8_t* w, int64_t row_bytes, const QRows<T>& x, const float* bias,
                   float* out, int64_t N, int64_t n0, int64_t n1) {
  // NOTE: up to 4 rows of x share each weight vector; more rows take more passes.
  for (int64_t m = 0; m < x.M; m += 4) {
    switch (std::min<int64_t>(4, x.M - m)) {
      case 1: rows_simd<F, 1>(w, row_bytes, x, m, bias, out, N, n0, n1); break;
      case 2: rows_simd<F, 2>(w, row_bytes, x, m, bias, out, N, n0, n1); break;
      case 3: rows_simd<F, 3>(w, row_bytes, x, m, bias, out, N, n0, n1); break;
      default: rows_simd<F, 4>(w, row_bytes, x, m, bias, out, N, n0, n1); break;
    }
  }
}

// ---- Interleaved rows (quant_x8.h): a vector's 32-bit lanes are 8 weight rows, 16-bit x ----
// acc + each row's two products of its 16-bit lanes with x's pair (x[i], x[i + 1]).
inline IV dot_pairs(IV acc, IV q, const int16_t* x_pair) {
  int32_t both;
  std::memcpy(&both, x_pair, 4);
  const IV x = _mm256_set1_epi32(both);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, q, x);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(q, x));
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// Two groups of 8 rows side by side in a 512-bit vector (group_x16): half the instructions
// a value, x's pairs broadcast once for 16 rows. From kX16MinRows rows of x: decode batches of
// 4 and 8 ran 1.04-1.21x as fast on a Zen 4, but one row 0.91-0.92x on SmolLM2's small
// matrices, whose two streams a thread (one a group) start cold more often than one
// (docs/notes/2026-11-29-interleaved-rows.md, "Two groups of rows a 512-bit vector").
#define KV_X16 1
constexpr int64_t kX16MinRows = 4;
using ZV = __m512i;
using FZ = __m512;
inline ZV join(IV lo, IV hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
inline FZ join(FV lo, FV hi) {
  const __m512d wide = _mm512_castps_pd(_mm512_castps256_ps512(lo));
  return _mm512_castpd_ps(_mm512_insertf64x4(wide, _mm256_castps_pd(hi), 1));
}
inline ZV dot_pairs(ZV acc, ZV q, const int16_t* x_pair) {
  int32_t both;
  std::memcpy(&both, x_pair, 4);
  const ZV x = _mm512_set1_epi32(both);
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, q, x);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(q, x));
#endif
}
#endif

// How a format's block of values comes apart for the byte dot products: kChunks loads of 32
// bytes, each kParts<W> vectors of 4 values a lane, part k's values from kPartAt[k] among
// the chunk's 32 / kChunks, its sum shifted left by kPartShift[k] bits; kBias: what each
// value carries on top (the block's sum less kBias * sum(x)).
struct Q4Bytes {
  static constexpr int kChunks = 4, kBias = 0;
  template <class W>
  static constexpr int kParts = 2;
  static constexpr int kPartAt[2] = {0, 4}, kPartShift[2] = {0, 0};
  template <class W>
  static void parts(typename W::I chunk, typename W::I* p) {
    p[0] = W::low(chunk);
    p[1] = W::high(chunk);
  }
};

struct Q8Bytes {
  static constexpr int kChunks = 8, kBias = 128;
  template <class W>
  static constexpr int kParts = W::kVnni ? 1 : 2;
  static constexpr int kPartAt[2] = {0, 0}, kPartShift[2] = {0, 4};
  template <class W>
  static void parts(typename W::I chunk, typename W::I* p) {
    const typename W::I biased = W::flip(W::quads(chunk));
    if constexpr (W::kVnni) {
      p[0] = biased;
    } else {
      p[0] = W::low(biased);
      p[1] = W::high(biased);
    }
  }
};

// Interleaved formats (quant_x8.h): a group's block of 8 rows (kBlockBytes, holding kSubs
// blocks of 32 values a row), each sub-block's scales and offsets (a lane a row) and where its
// values start (Q4x8, Q4Kx8: 4 chunks of 32 bytes, 4 values a lane; Q8x8: pairs, below).
template <bool kHasMin>
struct Q4x8 {
  using Plain = Q4<kHasMin>;  // the last N % 8 rows
  static constexpr int64_t kSubs = 1, kScalars = kHasMin ? 4 : 2, kBlockBytes = 8 * Plain::kBytes;
  static constexpr bool kHasOffset = true;
  static void scales(const uint8_t* b, int, FV* d, FV* offset) {
    *d = _mm256_cvtph_ps(load16(b));
    *offset = kHasMin ? _mm256_cvtph_ps(load16(b + 16)) : _mm256_mul_ps(*d, _mm256_set1_ps(-8.f));
  }
  static const uint8_t* values(const uint8_t* b, int) { return b + quant_x8::kRows * kScalars; }
  using Bytes = Q4Bytes;  // group_bytes: how a block's values come apart
};

// Q4_K: a super-block of 8 sub-blocks, each with a scale and offset a row, its values as Q4's.
struct Q4Kx8 : Q4x8<true> {
  using Plain = Q4_K;
  static constexpr int64_t kSubs = 8, kBlockBytes = 8 * Plain::kBytes;
  static void scales(const uint8_t* b, int j, FV* d, FV* offset) {
    quant_x8::q4k_scales(b, j, d, offset);
  }
  static const uint8_t* values(const uint8_t* b, int j) {
    return b + quant_x8::kQ4KValues + quant_x8::kQ4KSubBytes * j;
  }
};

struct Q8x8 {
  using Plain = Q8_0;
  using Bytes = Q8Bytes;  // group_bytes on 8-bit x
  static constexpr int64_t kSubs = 1, kScalars = 2, kBlockBytes = 8 * Plain::kBytes;
  static constexpr bool kHasOffset = false;
  static void scales(const uint8_t* b, int, FV* d, FV* offset) {
    *d = _mm256_cvtph_ps(load16(b));
    *offset = fzero();
  }
  static const uint8_t* values(const uint8_t* b, int) { return b + quant_x8::kRows * kScalars; }
  static const uint8_t* chunk(const uint8_t* values, int c) { return values + 64 * c; }
  template <int k>
  static IV pairs(const uint8_t* chunk) {  // pair 4c + k: 16 bytes widened
    return _mm256_cvtepi8_epi16(load16(chunk + 16 * k));
  }
#if defined(KV_X16)
  struct Chunks {
    const uint8_t *a, *b;
  };
  static Chunks chunk16(const uint8_t* a, const uint8_t* b, int c) {
    return {chunk(a, c), chunk(b, c)};
  }
  template <int k>
  static ZV pairs16(Chunks chunks) {
    const __m256i both = _mm256_inserti128_si256(
        _mm256_castsi128_si256(load16(chunks.a + 16 * k)), load16(chunks.b + 16 * k), 1);
    return _mm512_cvtepi8_epi16(both);
  }
#endif
};

// out[m, n..n+7] for the group of 8 weight rows from n and M rows of x from row m0.
template <class X, int M>
void group_x8(const uint8_t* group, const QRows<int16_t>& x, int64_t m0, const float* bias,
              float* out, int64_t N, int64_t n) {
  const int64_t blocks = x.blocks();
  FV acc[M], offsets[M];  // lane r: row n + r's sum of scaled products, and of offset * sx
  for (int m = 0; m < M; ++m) acc[m] = offsets[m] = fzero();
  for (int64_t j = 0; j < blocks; ++j) {
    const uint8_t* b = group + j / X::kSubs * X::kBlockBytes;
    const int sub = static_cast<int>(j % X::kSubs);
    if (sub == 0) prefetch_row(b, X::kBlockBytes);
    FV d, offset;
    X::scales(b, sub, &d, &offset);
    // NOTE: two sums a row, so that each dot product waits on the one before the last.
    IV even[M], odd[M];
    for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm256_setzero_si256();
    const uint8_t* values = X::values(b, sub);
    for (int c = 0; c < 4; ++c) {
      const auto chunk = X::chunk(values, c);
      const IV q0 = X::template pairs<0>(chunk), q1 = X::template pairs<1>(chunk);
      const IV q2 = X::template pairs<2>(chunk), q3 = X::template pairs<3>(chunk);
      for (int m = 0; m < M; ++m) {
        const int16_t* xm = x.q.data() + (m0 + m) * x.K + 32 * j + 8 * c;
        even[m] = dot_pairs(even[m], q0, xm);
        odd[m] = dot_pairs(odd[m], q1, xm + 2);
        even[m] = dot_pairs(even[m], q2, xm + 4);
        odd[m] = dot_pairs(odd[m], q3, xm + 6);
      }
    }
    for (int m = 0; m < M; ++m) {
      const int64_t xb = (m0 + m) * blocks + j;
      const FV products = _mm256_cvtepi32_ps(_mm256_add_epi32(even[m], odd[m]));
      acc[m] = _mm256_fmadd_ps(products, _mm256_mul_ps(d, _mm256_set1_ps(x.d(xb))), acc[m]);
      if constexpr (X::kHasOffset)
        offsets[m] = _mm256_fmadd_ps(offset, _mm256_set1_ps(x.s(xb)), offsets[m]);
    }
  }
  const FV b = bias ? _mm256_loadu_ps(bias + n) : fzero();
  for (int m = 0; m < M; ++m)
    _mm256_storeu_ps(out + (m0 + m) * N + n, _mm256_add_ps(_mm256_add_ps(acc[m], offsets[m]), b));
}

#if defined(KV_X16)
// group_x8 for groups a and b (rows n..n+7 and n+8..n+15) at once, each lane the same sums
// in the same order as group_x8's: the same floats.
// NOTE: the two groups are two streams, a group apart, and the next pair starts two groups
// on: each block asks for its twins in the next pair (prefetch_row's distance ahead of one
// stream fell inside the other, and half the reads missed: 1.8x slower from memory).
template <class X, int M>
void group_x16(const uint8_t* a, const uint8_t* b_group, const QRows<int16_t>& x, int64_t m0,
               const float* bias, float* out, int64_t N, int64_t n) {
  const int64_t next_pair = 2 * (b_group - a);
  const int64_t blocks = x.blocks();
  FZ acc[M], offsets[M];
  for (int m = 0; m < M; ++m) acc[m] = offsets[m] = _mm512_setzero_ps();
  for (int64_t j = 0; j < blocks; ++j) {
    const int64_t at = j / X::kSubs * X::kBlockBytes;
    const uint8_t *ba = a + at, *bb = b_group + at;
    const int sub = static_cast<int>(j % X::kSubs);
    if (sub == 0 && weight_prefetch_bytes != 0) {
      simd::prefetch(ba + next_pair, X::kBlockBytes);
      simd::prefetch(bb + next_pair, X::kBlockBytes);
    }
    FV da, db, offset_a, offset_b;
    X::scales(ba, sub, &da, &offset_a);
    X::scales(bb, sub, &db, &offset_b);
    const FZ d = join(da, db), offset = join(offset_a, offset_b);
    ZV even[M], odd[M];  // as group_x8's
    for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm512_setzero_si512();
    const uint8_t *va = X::values(ba, sub), *vb = X::values(bb, sub);
    for (int c = 0; c < 4; ++c) {
      const auto chunk = X::chunk16(va, vb, c);
      const ZV q0 = X::template pairs16<0>(chunk), q1 = X::template pairs16<1>(chunk);
      const ZV q2 = X::template pairs16<2>(chunk), q3 = X::template pairs16<3>(chunk);
      for (int m = 0; m < M; ++m) {
        const int16_t* xm = x.q.data() + (m0 + m) * x.K + 32 * j + 8 * c;
        even[m] = dot_pairs(even[m], q0, xm);
        odd[m] = dot_pairs(odd[m], q1, xm + 2);
        even[m] = dot_pairs(even[m], q2, xm + 4);
        odd[m] = dot_pairs(odd[m], q3, xm + 6);
      }
    }
    for (int m = 0; m < M; ++m) {
      const int64_t xb = (m0 + m) * blocks + j;
      const FZ products = _mm512_cvtepi32_ps(_mm512_add_epi32(even[m], odd[m]));
      acc[m] = _mm512_fmadd_ps(products, _mm512_mul_ps(d, _mm512_set1_ps(x.d(xb))), acc[m]);
      if constexpr (X::kHasOffset)
        offsets[m] = _mm512_fmadd_ps(offset, _mm512_set1_ps(x.s(xb)), offsets[m]);
    }
  }
  const FZ bv = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
  for (int m = 0; m < M; ++m)
    _mm512_storeu_ps(out + (m0 + m) * N + n,
                     _mm512_add_ps(_mm512_add_ps(acc[m], offsets[m]), bv));
}

// Groups g and g + 1 against every row of x, up to 4 rows of x a pass over the weights.
template <class X>
void group_pair_x16(const uint8_t* w, int64_t row_bytes, const QRows<int16_t>& x,
                    const float* bias, float* out, int64_t N, int64_t g) {
  const int64_t group_bytes = quant_x8::kRows * row_bytes, n = g * quant_x8::kRows;
  const uint8_t *a = w + g * group_bytes, *b = a + group_bytes;
  for (int64_t m = 0; m < x.M; m += 4) {
    switch (std::min<int64_t>(4, x.M - m)) {
      case 1: group_x16<X, 1>(a, b, x, m, bias, out, N, n); break;
      case 2: group_x16<X, 2>(a, b, x, m, bias, out, N, n); break;
      case 3: group_x16<X, 3>(a, b, x, m, bias, out, N, n); break;
      default: group_x16<X, 4>(a, b, x, m, bias, out, N, n); break;
    }
  }
}
#endif

// Groups g0..g1 of 8 rows against every row of x, up to 4 rows of x a pass over the weights.
template <class X>
void groups_x8(const uint8_t* w, int64_t row_bytes, const QRows<int16_t>& x, const float* bias,
               float* out, int64_t N, int64_t g0, int64_t g1) {
#if defined(KV_X16)
  if (x.M >= kX16MinRows && x16_enabled.load(std::memory_order_relaxed))
    for (; g0 + 1 < g1; g0 += 2) group_pair_x16<X>(w, row_bytes, x, bias, out, N, g0);
#endif
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = w + g * quant_x8::kRows * row_bytes;
    const int64_t n = g * quant_x8::kRows;
    for (int64_t m = 0; m < x.M; m += 4) {
      switch (std::min<int64_t>(4, x.M - m)) {
        case 1: group_x8<X, 1>(group, x, m, bias, out, N, n); break;
        case 2: group_x8<X, 2>(group, x, m, bias, out, N, n); break;
        case 3: group_x8<X, 3>(group, x, m, bias, out, N, n); break;
        default: group_x8<X, 4>(group, x, m, bias, out, N, n); break;
      }
    }
  }
}

template <class X>
void gemv_x8(const uint8_t* w, const QRows<int16_t>& x, const float* bias, float* out,
             int64_t N) {
  const int64_t row_bytes = x.blocks() / X::kSubs * X::Plain::kBytes;
  const int64_t groups = N / quant_x8::kRows;
  kernels::parallel_for(0, groups, 2, [&](int64_t g0, int64_t g1) {
    groups_x8<X>(w, row_bytes, x, bias, out, N, g0, g1);
  });
  // the last N % 8 rows, as GGUF has them
  rows_simd_all<typename X::Plain>(w, row_bytes, x, bias, out, N, groups * quant_x8::kRows, N);
}

// ---- Interleaved rows by byte dot products: a 32-bit lane holds 4 values of its row ------
// Each lane's 4 bytes times 4 broadcast bytes of x, summed: VNNI's vpdpbusd (unsigned times
// signed bytes), or AVX2's maddubs + madd where a pair's products stay under int16's limit.
//   Q4 (Q4x8, Q4Kx8): a chunk's low nibbles are values 8c..8c+3 of each row, its high ones
//     8c+4..8c+7 (pairs at most 2 * 255 * 15: no saturation).
//   Q8_0 (Q8x8), 8-bit x only: chunks 2c and 2c + 1 hold values 4c..4c+3, a pair a row each,
//     shuffled into one lane a row; q + 128 (the top bit flipped: unsigned) times x, the
//     block's sum less 128 * sum(x). Without VNNI two such products overflow maddubs: each
//     byte goes as its two nibbles, the high one's sum times 16.
// NOTE: 16-bit x multiplies as two bytes, x = 256 * hi + lo (lo unsigned, hi signed): q * x
// is 256 * (q * hi) + q * lo, each a product of bytes, so the integer sums, and the floats
// after them, are the 16-bit pairs' ones exactly, in less than half the nibble unpacking (3
// operations a chunk against 7: docs/notes/2026-11-29-interleaved-rows.md, "Byte dot products on interleaved rows").

// Vector widths: 256 bits hold one group of 8 rows, 512 bits two groups side by side (lanes
// 0-7 the first, 8-15 the second), from kX16MinRows rows of x.
struct W256 {
  static constexpr int kGroups = 1;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  static constexpr bool kVnni = true;
#else
  static constexpr bool kVnni = false;
#endif
  using I = __m256i;
  using F = __m256;
  static I izero() { return _mm256_setzero_si256(); }
  static F fzero() { return _mm256_setzero_ps(); }
  static I load(const uint8_t* const* at, int64_t offset) { return load_x(at[0] + offset); }
  static F join(const FV* parts) { return parts[0]; }
  static I set1(int32_t v) { return _mm256_set1_epi32(v); }
  static I low(I v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
  static I high(I v) { return low(_mm256_srli_epi16(v, 4)); }
  static I flip(I v) { return _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))); }
  // Each 128-bit half's two 8-byte halves (4 rows' pairs each) into 4 rows' quads: first the
  // halves of both 16-byte chunks side by side, then a row's two pairs into its lane.
  static I quads(I v) {
    const __m128i pick = _mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    return _mm256_shuffle_epi8(_mm256_permute4x64_epi64(v, 0xD8), _mm256_broadcastsi128_si256(pick));
  }
  static I dot4(I acc, I u, I s) {  // acc + each lane's 4 products of u's and s's bytes
    if constexpr (kVnni) return _mm256_dpbusd_epi32(acc, u, s);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
  template <int kBits>
  static I shl(I a) { return _mm256_slli_epi32(a, kBits); }
  static F to_float(I a) { return _mm256_cvtepi32_ps(a); }
  static F fset1(float v) { return _mm256_set1_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fadd(F a, F b) { return _mm256_add_ps(a, b); }
  static F loadf(const float* p) { return _mm256_loadu_ps(p); }
  static void storef(float* p, F v) { _mm256_storeu_ps(p, v); }
};

#if defined(KV_X16)
struct W512 {
  static constexpr int kGroups = 2;
#if defined(__AVX512VNNI__)
  static constexpr bool kVnni = true;
#else
  static constexpr bool kVnni = false;
#endif
  using I = __m512i;
  using F = __m512;
  static I izero() { return _mm512_setzero_si512(); }
  static F fzero() { return _mm512_setzero_ps(); }
  static I load(const uint8_t* const* at, int64_t offset) {
    return ::join(load_x(at[0] + offset), load_x(at[1] + offset));
  }
  static F join(const FV* parts) { return ::join(parts[0], parts[1]); }
  static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  static I low(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
  static I high(I v) { return low(_mm512_srli_epi16(v, 4)); }
  static I flip(I v) { return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80))); }
  static I quads(I v) {  // W256::quads in each group's 256 bits
    const __m128i pick = _mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    const I halves = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 1, 3, 4, 6, 5, 7), v);
    return _mm512_shuffle_epi8(halves, _mm512_broadcast_i32x4(pick));
  }
  static I dot4(I acc, I u, I s) {
    if constexpr (kVnni) return _mm512_dpbusd_epi32(acc, u, s);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
  }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  template <int kBits>
  static I shl(I a) { return _mm512_slli_epi32(a, kBits); }
  static F to_float(I a) { return _mm512_cvtepi32_ps(a); }
  static F fset1(float v) { return _mm512_set1_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fadd(F a, F b) { return _mm512_add_ps(a, b); }
  static F loadf(const float* p) { return _mm512_loadu_ps(p); }
  static void storef(float* p, F v) { _mm512_storeu_ps(p, v); }
};
#endif

inline int32_t four_bytes(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 8-bit x as the byte kernels read it: one sum a part, and each block's sum of x (for kBias).
struct Bytes8 {
  static constexpr int kSums = 1;  // a part
  const QRows<int8_t>& rows;
  explicit Bytes8(const QRows<int8_t>& x) : rows(x) {}
  const QRows<int8_t>& scales() const { return rows; }
  int32_t sum(int64_t b) const { return rows.sums[b]; }
  struct Row {  // row m of x
    const int8_t* q;
  };
  Row row(int64_t m) const { return {rows.q.data() + m * rows.K}; }
  template <class W>
  static void dot(typename W::I part, Row x, int64_t at, typename W::I* s) {
    s[0] = W::dot4(s[0], part, W::set1(four_bytes(x.q + at)));
  }
  template <class W>
  static typename W::I total(const typename W::I* s) { return s[0]; }
};

// 16-bit x split into bytes, x = 256 * hi + lo: the sums of q * lo (lo the unsigned side) and
// of q * hi (q the unsigned side), a part. Not for biased formats (kBias).
struct Bytes16 {
  static constexpr int kSums = 2;
  const QRows<int16_t>& rows;
  const uint8_t* lo;
  const int8_t* hi;
  Bytes16(const QRows<int16_t>& x, ByteSplit& split) : rows(x) {  // split: grown as needed
    split.lo.resize(x.q.size()), split.hi.resize(x.q.size());
    lo = split.lo.data(), hi = split.hi.data();
    const __m256i low_byte = _mm256_set1_epi16(0xFF);
    for (size_t i = 0; i < x.q.size(); i += 32) {  // K: whole blocks of 32
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + i + 16));
      // the packs work within 128-bit halves: 0xD8 puts the four quarters back in order
      const __m256i l = _mm256_packus_epi16(_mm256_and_si256(a, low_byte), _mm256_and_si256(b, low_byte));
      // arithmetic shifts: the floor of x / 256, in -128..127 (no saturation)
      const __m256i h = _mm256_packs_epi16(_mm256_srai_epi16(a, 8), _mm256_srai_epi16(b, 8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(split.lo.data() + i), _mm256_permute4x64_epi64(l, 0xD8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(split.hi.data() + i), _mm256_permute4x64_epi64(h, 0xD8));
    }
  }
  const QRows<int16_t>& scales() const { return rows; }
  int32_t sum(int64_t) const { return 0; }
  struct Row {
    const uint8_t* lo;
    const int8_t* hi;
  };
  Row row(int64_t m) const { return {lo + m * rows.K, hi + m * rows.K}; }
  template <class W>
  static void dot(typename W::I part, Row x, int64_t at, typename W::I* s) {
    s[0] = W::dot4(s[0], W::set1(four_bytes(x.lo + at)), part);
    s[1] = W::dot4(s[1], part, W::set1(four_bytes(x.hi + at)));
  }
  template <class W>
  static typename W::I total(const typename W::I* s) { return W::add(W::template shl<8>(s[1]), s[0]); }
};

inline Bytes8 make_bytes(const QRows<int8_t>& x, ByteSplit&) { return Bytes8(x); }
inline Bytes16 make_bytes(const QRows<int16_t>& x, ByteSplit& split) { return Bytes16(x, split); }

// out[m, n..] for W::kGroups groups of 8 weight rows from n (`at`: each group's first byte, the
// second the first's next group) and M rows of x from row m0: each lane the integer sums of
// its row's blocks, then the floats group_x8 makes of them.
template <class W, class X, int M, class XB>
void group_bytes(const uint8_t* const* at, const XB& x, int64_t m0, const float* bias,
                 float* out, int64_t N, int64_t n) {
  using I = typename W::I;
  using F = typename W::F;
  using B = typename X::Bytes;
  constexpr int kParts = B::template kParts<W>, kChunkValues = 32 / B::kChunks;
  static_assert(B::kBias == 0 || std::is_same_v<XB, Bytes8>, "biased bytes take 8-bit x only");
  const auto& scales = x.scales();
  const int64_t blocks = scales.blocks();
  // NOTE: two groups are two streams a group apart, and the next pair starts two groups on:
  // each block asks for its twins in the next pair (prefetch_row's distance ahead of one
  // stream fell inside the other, and half the reads missed: 1.8x slower from memory).
  const int64_t next_pair = 2 * (at[W::kGroups - 1] - at[0]);
  F acc[M], offsets[M];  // lane r: row n + r's sum of scaled products, and of offset * sx
  typename XB::Row rows[M];  // NOTE: each row's bytes found once, not at every dot product
  for (int m = 0; m < M; ++m) {
    acc[m] = offsets[m] = W::fzero();
    rows[m] = x.row(m0 + m);
  }
  for (int64_t j = 0; j < blocks; ++j) {
    const int64_t start = j / X::kSubs * X::kBlockBytes;
    const int sub = static_cast<int>(j % X::kSubs);
    const uint8_t* b[W::kGroups];
    FV ds[W::kGroups], os[W::kGroups];
    for (int g = 0; g < W::kGroups; ++g) {
      b[g] = at[g] + start;
      if (sub == 0 && W::kGroups == 1) prefetch_row(b[g], X::kBlockBytes);
      if (sub == 0 && W::kGroups > 1 && weight_prefetch_bytes != 0)
        simd::prefetch(b[g] + next_pair, X::kBlockBytes);
      X::scales(b[g], sub, &ds[g], &os[g]);
      b[g] = X::values(b[g], sub);
    }
    const F d = W::join(ds), offset = W::join(os);
    // NOTE: a sum (16-bit x: a pair of sums) a part, two chains of dot products a row, but for
    // 16-bit x in 512 bits: its parts, all unshifted, share a pair (two pairs held 16
    // accumulators at 4 rows of x, and ran 1.15x slower than the 16-bit pairs had; one pair
    // at 1 row in 256 bits 1.05x slower than two).
    constexpr int kSlots = XB::kSums == 1 || W::kGroups == 1 ? kParts : 1;
    static_assert(kSlots == kParts || B::kPartShift[kParts - 1] == 0, "shifted parts apart");
    I sums[M][kSlots * XB::kSums];
    for (int m = 0; m < M; ++m)
      for (I& s : sums[m]) s = W::izero();
    for (int c = 0; c < B::kChunks; ++c) {
      I parts[kParts];
      B::template parts<W>(W::load(b, 32 * c), parts);
      for (int m = 0; m < M; ++m)
        for (int k = 0; k < kParts; ++k)
          XB::template dot<W>(parts[k], rows[m], 32 * j + kChunkValues * c + B::kPartAt[k],
                              &sums[m][XB::kSums * (kSlots == 1 ? 0 : k)]);
    }
    for (int m = 0; m < M; ++m) {
      const int64_t xb = (m0 + m) * blocks + j;
      I total = XB::template total<W>(sums[m]);
      if constexpr (kSlots > 1)
        total = W::add(total, W::template shl<B::kPartShift[1]>(XB::template total<W>(&sums[m][XB::kSums])));
      if constexpr (B::kBias != 0) total = W::sub(total, W::set1(B::kBias * x.sum(xb)));
      const F products = W::to_float(total);
      acc[m] = W::fmadd(products, W::mul(d, W::fset1(scales.d(xb))), acc[m]);
      if constexpr (X::kHasOffset)
        offsets[m] = W::fmadd(offset, W::fset1(scales.s(xb)), offsets[m]);
    }
  }
  const F bv = bias ? W::loadf(bias + n) : W::fzero();
  for (int m = 0; m < M; ++m)
    W::storef(out + (m0 + m) * N + n, W::fadd(W::fadd(acc[m], offsets[m]), bv));
}

// W::kGroups groups from group g against every row of x, up to 4 rows of x a pass.
template <class W, class X, class XB>
void byte_groups_once(const uint8_t* w, int64_t row_bytes, const XB& x, const float* bias,
                      float* out, int64_t N, int64_t g) {
  const int64_t group_size = quant_x8::kRows * row_bytes, n = g * quant_x8::kRows;
  const uint8_t* at[W::kGroups];
  for (int i = 0; i < W::kGroups; ++i) at[i] = w + (g + i) * group_size;
  const int64_t M = x.scales().M;
  for (int64_t m = 0; m < M; m += 4) {
    switch (std::min<int64_t>(4, M - m)) {
      case 1: group_bytes<W, X, 1>(at, x, m, bias, out, N, n); break;
      case 2: group_bytes<W, X, 2>(at, x, m, bias, out, N, n); break;
      case 3: group_bytes<W, X, 3>(at, x, m, bias, out, N, n); break;
      default: group_bytes<W, X, 4>(at, x, m, bias, out, N, n); break;
    }
  }
}

template <class X, class XB>
void gemv_bytes_x8(const uint8_t* w, const XB& x, const float* bias, float* out, int64_t N) {
  const auto& scales = x.scales();
  const int64_t row_bytes = scales.blocks() / X::kSubs * X::Plain::kBytes;
  const int64_t groups = N / quant_x8::kRows;
  kernels::parallel_for(0, groups, 2, [&](int64_t g0, int64_t g1) {
#if defined(KV_X16)
    if (scales.M >= kX16MinRows && x16_enabled.load(std::memory_order_relaxed))
      for (; g0 + 1 < g1; g0 += 2) byte_groups_once<W512, X>(w, row_bytes, x, bias, out, N, g0);
#endif
    for (; g0 < g1; ++g0) byte_groups_once<W256, X>(w, row_bytes, x, bias, out, N, g0);
  });
  // the last N % 8 rows, as GGUF has them
  rows_simd_all<typename X::Plain>(w, row_bytes, scales, bias, out, N, groups * quant_x8::kRows, N);
}
#endif  // KV_DOT_SIMD

template <class F, class T>
void gemv_q(const uint8_t* w, const QRows<T>& x, const float* bias, float* out, int64_t N,
            bool portable) {
  const int64_t row_bytes = x.blocks() / F::kSubs * F::kBytes;
  kernels::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
#if defined(KV_DOT_SIMD)
    if (!portable) return rows_simd_all<F>(w, row_bytes, x, bias, out, N, n0, n1);
#endif
    rows_portable<F>(w, row_bytes, x, bias, out, N, n0, n1);
  });
}

// Rows in GGUF's layout, whichever format.
template <class T>
void gemv_plain(int64_t qtype, const uint8_t* w, const QRows<T>& xq, const float* bias,
                float* out, int64_t N, bool portable) {
  switch (qtype) {
    case kQ8_0: gemv_q<Q8_0>(w, xq, bias, out, N, portable); break;
    case kQ4_0: gemv_q<Q4<false>>(w, xq, bias, out, N, portable); break;
    case kQ4_1: gemv_q<Q4<true>>(w, xq, bias, out, N, portable); break;
    case kQ5_0: gemv_q<Q5_0>(w, xq, bias, out, N, portable); break;
    case kQ4_K: gemv_q<Q4_K>(w, xq, bias, out, N, portable); break;
  }
}

// Interleaved rows (quant_x8.h): their own kernel (16-bit x split into `split` for the byte
// kernels), or (portable, or no SIMD in this build) the rows put back in GGUF's layout for
// the scalar one.
template <class T>
void gemv_interleaved(int64_t qtype, const uint8_t* w, const QRows<T>& x, ByteSplit& split,
                      const float* bias, float* out, int64_t N, bool portable) {
  const int64_t ggml_type = quant_x8::base_type(qtype);
#if defined(KV_DOT_SIMD)
  if (!portable) {
    using XB = std::conditional_t<std::is_same_v<T, int8_t>, Bytes8, Bytes16>;
    if constexpr (std::is_same_v<T, int16_t>) {  // 16-bit pairs (group_x8)
      if (ggml_type == kQ8_0) return gemv_x8<Q8x8>(w, x, bias, out, N);
    }
    const XB bytes = make_bytes(x, split);
    if constexpr (std::is_same_v<T, int8_t>) {
      if (ggml_type == kQ8_0) return gemv_bytes_x8<Q8x8>(w, bytes, bias, out, N);
    }
    if (ggml_type == kQ4_1) return gemv_bytes_x8<Q4x8<true>>(w, bytes, bias, out, N);
    if (ggml_type == kQ4_0) return gemv_bytes_x8<Q4x8<false>>(w, bytes, bias, out, N);
    return gemv_bytes_x8<Q4Kx8>(w, bytes, bias, out, N);
  }
#endif
  const Format f = format_of(ggml_type);
  const int64_t row_bytes = x.K / f.values * f.bytes;
  std::vector<uint8_t> plain(N * row_bytes);
  quant_x8::convert(w, plain.data(), ggml_type, N, row_bytes, false);
  gemv_plain(ggml_type, plain.data(), x, bias, out, N, true);
}

template <class T>
void gemv_rows_of(int64_t qtype, const uint8_t* w, const float* x, int64_t M, int64_t K,
                  const float* bias, float* out, int64_t N, bool portable) {
  // NOTE: a decode step's x is quantized (and split into bytes) into buffers this thread
  // keeps for its next GEMV (the loop's other threads read them only while this call waits
  // for them); more rows, into buffers of their own, so that no thread keeps a large one
  thread_local XBuffers<T> kept;
  XBuffers<T> own;
  XBuffers<T>& buffers = M <= kKeptRows ? kept : own;
  quantize_into(buffers.rows, x, M, K);
  const QRows<T>& xq = buffers.rows;
  if (quant_x8::interleaved(qtype))
    return gemv_interleaved(qtype, w, xq, buffers.bytes, bias, out, N, portable);
  gemv_plain(qtype, w, xq, bias, out, N, portable);
}

}  // namespace

// out [M, K] float32 = x [M, K] rounded as quant_gemv_int rounds it to `bits` (8 or 16):
// d * q per block of 32, so that prefill's float GEMM multiplies what decode's GEMV does.
void kernels::quant_round_rows(at::Tensor out, at::Tensor x, int64_t bits) {
  TORCH_CHECK(bits == 8 || bits == 16, "bits: 8 or 16, got ", bits);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() &&
                  x.size(1) % 32 == 0,
              "x: contiguous float32 [M, K], K a multiple of 32");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.sizes() == x.sizes(),
              "out: contiguous float32 of x's shape");
  const int64_t M = x.size(0), K = x.size(1);
  const float* xi = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  auto round = [&](auto zero, int64_t m0, int64_t m1) {
    using T = decltype(zero);
    const QRows<T> r = quantize_rows<T>(xi + m0 * K, m1 - m0, K);
    for (int64_t b = 0; b < (m1 - m0) * K / 32; ++b)
      for (int i = 0; i < 32; ++i) o[m0 * K + 32 * b + i] = r.d(b) * r.q[32 * b + i];
  };
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    if (bits == 8) round(int8_t{}, m0, m1);
    else round(int16_t{}, m0, m1);
  });
}

bool kernels::set_gemv_x16(bool on) { return x16_enabled.exchange(on); }

// out [M, N] float32 = x [M, K] float32, quantized to `bits` (8 or 16) per block of 32,
// @ w^T (+ bias), in integer dot products. `portable` runs the scalar path whatever the build.
void kernels::quant_gemv_int(at::Tensor out, at::Tensor x, at::Tensor w, int64_t qtype,
                             c10::optional<at::Tensor> bias, int64_t bits, bool portable) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  check_weight(w, qtype, K);
  TORCH_CHECK(bits == 8 || bits == 16, "bits: 8 or 16, got ", bits);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x: contiguous float32 [M, K]");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.size(0) == M &&
                  out.size(1) == N,
              "out: contiguous float32 [M, N]");
  TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == at::kFloat && bias->numel() == N),
              "bias: float32 [N]");
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const uint8_t* wi = w.data_ptr<uint8_t>();
  const float* xi = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  if (bits == 8)
    gemv_rows_of<int8_t>(qtype, wi, xi, M, K, b, o, N, portable);
  else
    gemv_rows_of<int16_t>(qtype, wi, xi, M, K, b, o, N, portable);
}
