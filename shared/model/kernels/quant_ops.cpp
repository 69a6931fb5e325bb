// Kernels on quantized (GGUF) weights, read in ggml's own block layouts. Registered into the
// same module as cpu_ops.cpp. Each build compiles the path of its instruction set: AVX-512
// (16 floats a vector) or AVX2 + FMA (8), with a scalar path for anything else.
//
// Weights are [N, row_bytes] uint8: each row is its own run of blocks, so rows of several
// GGUF tensors can be concatenated (fused qkv, gate_up). Block layouts (ggml-common.h):
//   Q8_0  32 values, 34 bytes: fp16 d, int8 q[32]                       x = d * q
//   Q4_0  32 values, 18 bytes: fp16 d, 16 bytes of nibbles              x = d * (q - 8)
//   Q4_1  32 values, 20 bytes: fp16 d, fp16 m, 16 bytes of nibbles      x = d * q + m
//         (value j in the low nibble of byte j, value j + 16 in its high nibble)
//   Q5_0  32 values, 22 bytes: fp16 d, 4 bytes of fifth bits (bit j: value j's), then Q4_0's
//         16 bytes of nibbles                                        x = d * (q - 16)
//   Q4_K 256 values, 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins for 8
//         sub-blocks of 32, then 4 x 32 bytes: the low nibbles of chunk c are sub-block 2c,
//         the high nibbles sub-block 2c + 1                             x = d*sc*q - dmin*mn
// Every format is a scale times small integers plus an offset per 32 values, so a dot
// product is d * sum(q * x) + offset * sum(x): the per-32 sums of x are computed once per
// call and shared by all output rows.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include "kernels.h"
#include "parallel.h"
#include "quant_blocks.h"
#include "quant_x8.h"
#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace quant_blocks;

// ---- Vectors: L floats; a group of 16 bytes widens to G = 16 / L vectors ----------------
#if defined(__AVX512F__)
constexpr int L = 16;
using V = __m512;
inline V vzero() { return _mm512_setzero_ps(); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline V vset(float v) { return _mm512_set1_ps(v); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline float vsum(V v) { return _mm512_reduce_add_ps(v); }
inline void widen_u8(__m128i b, V* out) { out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
inline void widen_i8(__m128i b, V* out) { out[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
#define KV_SIMD 1
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int L = 8;
using V = __m256;
inline V vzero() { return _mm256_setzero_ps(); }
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline V vset(float v) { return _mm256_set1_ps(v); }
inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
inline float vsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline void widen_u8(__m128i b, V* out) {
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(b, b)));
}
inline void widen_i8(__m128i b, V* out) {
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b)));
}
#define KV_SIMD 1
#endif

#if defined(KV_SIMD)
constexpr int G = 16 / L;

// The 32 values of 16 bytes of nibbles: lo[] the low nibbles (values 0-15), hi[] the high.
// NOTE: the bytes widen to 32-bit lanes first and split there, once for both halves: the
// widening is the scarce instruction (one port), splitting first took it twice as often.
inline void widen_nibbles(const uint8_t* q, V* lo, V* hi) {
#if defined(__AVX512F__)
  const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  lo[0] = _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(0x0F)));
  hi[0] = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
#else
  for (int g = 0; g < G; ++g) {
    const __m256i w =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * g)));
    lo[g] = _mm256_cvtepi32_ps(_mm256_and_si256(w, _mm256_set1_epi32(0x0F)));
    hi[g] = _mm256_cvtepi32_ps(_mm256_srli_epi32(w, 4));
  }
#endif
}

inline __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m128i low_nibbles(__m128i b) { return _mm_and_si128(b, _mm_set1_epi8(0x0F)); }
inline __m128i high_nibbles(__m128i b) {
  return _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
}

// For M rows of x (row stride ldx): acc[m] += scale * sum over 16 values of w * x[m].
// Two groups of 16 make up one scaled run of 32 values.
template <int M>
inline void dot32(const V* w_lo, const V* w_hi, const float* x, int64_t ldx, float scale, V* acc) {
  const V s = vset(scale);
  for (int m = 0; m < M; ++m) {
    const float* xm = x + m * ldx;
    V run = vmul(w_lo[0], vload(xm));
    for (int g = 1; g < G; ++g) run = vfma(w_lo[g], vload(xm + g * L), run);
    for (int g = 0; g < G; ++g) run = vfma(w_hi[g], vload(xm + 16 + g * L), run);
    acc[m] = vfma(s, run, acc[m]);
  }
}

// Each format: the dot products of one block with M rows of x. x points at the block's first
// value in row 0; xs at the block's first per-32 sum of x in row 0 (row stride ldxs).
struct Q8_0 {
  static constexpr int64_t kValues = 32, kBytes = 34;
  template <int M>
  static void dot(const uint8_t* b, const float* x, int64_t ldx, const float*, int64_t, V* acc,
                  float*) {
    V lo[G], hi[G];
    widen_i8(load16(b + 2), lo);
    widen_i8(load16(b + 18), hi);
    dot32<M>(lo, hi, x, ldx, half_to_float(b), acc);
  }
};

template <bool kHasMin>
struct Q4 {  // Q4_0 (offset -8 d) and Q4_1 (offset m)
  static constexpr int64_t kValues = 32, kBytes = kHasMin ? 20 : 18;
  template <int M>
  static void dot(const uint8_t* b, const float* x, int64_t ldx, const float* xs, int64_t ldxs,
                  V* acc, float* sacc) {
    float d, offset;
    q4_scale_offset<kHasMin>(b, &d, &offset);
    V lo[G], hi[G];
    widen_nibbles(b + (kHasMin ? 4 : 2), lo, hi);
    dot32<M>(lo, hi, x, ldx, d, acc);
    for (int m = 0; m < M; ++m) sacc[m] += offset * xs[m * ldxs];
  }
};

struct Q5_0 {
  static constexpr int64_t kValues = 32, kBytes = 22;
  template <int M>
  static void dot(const uint8_t* b, const float* x, int64_t ldx, const float* xs, int64_t ldxs,
                  V* acc, float* sacc) {
    const float d = half_to_float(b);
    __m128i q0, q1;
    q5_0_quants(b, &q0, &q1);
    V lo[G], hi[G];
    widen_u8(q0, lo);
    widen_u8(q1, hi);
    dot32<M>(lo, hi, x, ldx, d, acc);
    for (int m = 0; m < M; ++m) sacc[m] -= 16.f * d * xs[m * ldxs];
  }
};

struct Q4_K {
  static constexpr int64_t kValues = 256, kBytes = 144;
  template <int M>
  static void dot(const uint8_t* b, const float* x, int64_t ldx, const float* xs, int64_t ldxs,
                  V* acc, float* sacc) {
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    const uint8_t* scales = b + 4;
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = b + 16 + 32 * c;
      const __m128i q0 = load16(q), q1 = load16(q + 16);
      for (int half = 0; half < 2; ++half) {  // sub-block 2c: low nibbles, 2c + 1: high
        const int j = 2 * c + half;
        int sc, mn;
        q4k_scale_min(scales, j, &sc, &mn);
        V lo[G], hi[G];
        widen_u8(half ? high_nibbles(q0) : low_nibbles(q0), lo);
        widen_u8(half ? high_nibbles(q1) : low_nibbles(q1), hi);
        dot32<M>(lo, hi, x + 32 * j, ldx, d * sc, acc);
        for (int m = 0; m < M; ++m) sacc[m] -= dmin * mn * xs[m * ldxs + j];
      }
    }
  }
};

// out[m, n] for rows n in [n0, n1) and M rows of x.
template <class F, int M>
void gemv_rows(const uint8_t* w, int64_t row_bytes, int64_t K, const float* x, const float* xs,
               const float* bias, float* out, int64_t N, int64_t n0, int64_t n1) {
  const int64_t blocks = K / F::kValues, ldxs = K / 32;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    // NOTE: even and odd blocks add into accumulators of their own, named apart: one chain of
    // dependent FMAs through a row's blocks waited on each one's latency, and accumulators
    // picked by a computed index lived in memory, not registers.
    V even[M], odd[M];
    float even_offsets[M], odd_offsets[M];
    for (int m = 0; m < M; ++m) {
      even[m] = odd[m] = vzero();
      even_offsets[m] = odd_offsets[m] = 0.f;
    }
    prefetch_row(row, row_bytes);
    auto dot = [&](int64_t i, V* acc, float* offsets) {
      F::template dot<M>(row + i * F::kBytes, x + i * F::kValues, K,
                         xs + i * (F::kValues / 32), ldxs, acc, offsets);
    };
    int64_t i = 0;
    for (; i + 1 < blocks; i += 2) {
      dot(i, even, even_offsets);
      dot(i + 1, odd, odd_offsets);
    }
    if (i < blocks) dot(i, even, even_offsets);
    const float b = bias ? bias[n] : 0.f;
    for (int m = 0; m < M; ++m)
      out[m * N + n] = vsum(vadd(even[m], odd[m])) + (even_offsets[m] + odd_offsets[m]) + b;
  }
}
#endif  // KV_SIMD

// ---- Dequantize: one block to floats --------------------------------------------------
#if defined(KV_SIMD)
// y[0..32) = scale * w + offset, from the two widened halves of a run of 32 values.
inline void store32(const V* lo, const V* hi, float scale, float offset, float* y) {
  const V s = vset(scale), o = vset(offset);
  for (int g = 0; g < G; ++g) vstore(y + g * L, vfma(s, lo[g], o));
  for (int g = 0; g < G; ++g) vstore(y + 16 + g * L, vfma(s, hi[g], o));
}

void dequant_block(int64_t qtype, const uint8_t* b, float* y) {
  V lo[G], hi[G];
  const float d = half_to_float(b);
  if (qtype == kQ8_0) {
    widen_i8(load16(b + 2), lo);
    widen_i8(load16(b + 18), hi);
    store32(lo, hi, d, 0.f, y);
  } else if (qtype == kQ4_0 || qtype == kQ4_1) {
    widen_nibbles(b + (qtype == kQ4_1 ? 4 : 2), lo, hi);
    store32(lo, hi, d, qtype == kQ4_1 ? half_to_float(b + 2) : -8.f * d, y);
  } else if (qtype == kQ5_0) {
    __m128i q0, q1;
    q5_0_quants(b, &q0, &q1);
    widen_u8(q0, lo);
    widen_u8(q1, hi);
    store32(lo, hi, d, -16.f * d, y);
  } else {  // Q4_K
    const float dmin = half_to_float(b + 2);
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      q4k_scale_min(b + 4, j, &sc, &mn);
      const uint8_t* q = b + 16 + 32 * (j / 2);
      const __m128i q0 = load16(q), q1 = load16(q + 16);
      widen_u8(j % 2 ? high_nibbles(q0) : low_nibbles(q0), lo);
      widen_u8(j % 2 ? high_nibbles(q1) : low_nibbles(q1), hi);
      store32(lo, hi, d * sc, -dmin * mn, y + 32 * j);
    }
  }
}
#else
void dequant_block(int64_t qtype, const uint8_t* b, float* y) {
  if (qtype == kQ8_0) {
    const float d = half_to_float(b);
    for (int i = 0; i < 32; ++i) y[i] = d * static_cast<int8_t>(b[2 + i]);
  } else if (qtype == kQ4_0 || qtype == kQ4_1) {
    const float d = half_to_float(b);
    const float offset = qtype == kQ4_1 ? half_to_float(b + 2) : -8.f * d;
    const uint8_t* q = b + (qtype == kQ4_1 ? 4 : 2);
    for (int i = 0; i < 16; ++i) {
      y[i] = d * (q[i] & 0x0F) + offset;
      y[i + 16] = d * (q[i] >> 4) + offset;
    }
  } else if (qtype == kQ5_0) {
    const float d = half_to_float(b);
    for (int i = 0; i < 32; ++i) y[i] = d * q5_0_value(b, i) - 16.f * d;
  } else {  // Q4_K
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      q4k_scale_min(b + 4, j, &sc, &mn);
      const uint8_t* q = b + 16 + 32 * (j / 2);
      const int shift = (j % 2) * 4;
      for (int i = 0; i < 32; ++i) y[32 * j + i] = d * sc * ((q[i] >> shift) & 0x0F) - dmin * mn;
    }
  }
}
#endif

// out [R, K] float32 or bfloat16 = the rows of w dequantized; bfloat16 rounds each value to
// nearest even on the way out: one pass, half the bytes written of a float32 copy converted
// afterwards.
template <class T>
void dequantize_rows(const uint8_t* w, int64_t qtype, int64_t K, T* out, int64_t r0, int64_t r1) {
  const Format f = format_of(qtype);
  const int64_t blocks = K / f.values, row_bytes = blocks * f.bytes;
  alignas(64) float y[256];  // bfloat16's staging: the largest block (Q4_K)
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t i = 0; i < blocks; ++i) {
      const uint8_t* block = w + r * row_bytes + i * f.bytes;
      T* o = out + r * K + i * f.values;
      if constexpr (std::is_same_v<T, float>) {
        dequant_block(qtype, block, o);
      } else {
        dequant_block(qtype, block, y);
        for (int64_t j = 0; j < f.values; j += simd::kWidth) simd::store(o + j, simd::load(y + j));
      }
    }
}

// ---- Dequantize interleaved rows (quant_x8.h) -------------------------------------------
#if defined(KV_SIMD) && defined(__F16C__)
// Block j of a group of 8 interleaved rows to floats: row r's 32 values at y + r * ldy.
// NOTE: straight from the interleaved values, not through GGUF's layout first: putting each
// tile's rows back took prompts under --prefill-weights quantized 2-3x their time.
// Pair p = 4 * chunk + k of each row (values 2p, 2p + 1) as 16-bit lanes (2r, 2r + 1): Q8_0's
// bytes widened; Q4's nibbles (values 8 * chunk + 2k + h in bytes 4r + 2 (k % 2) + h of the
// chunk, low nibbles for k < 2, high ones after) picked out of each 128-bit half, then widened.
template <int64_t kType>
inline __m256i pairs_of(const uint8_t* values, int chunk, int k) {
  if constexpr (kType == kQ8_0) return _mm256_cvtepi8_epi16(load16(values + 64 * chunk + 16 * k));
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 32 * chunk));
  const __m256i nibbles = _mm256_and_si256(k < 2 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
  const char o = static_cast<char>(2 * (k % 2));
  const __m128i half = _mm_setr_epi8(o, o + 1, o + 4, o + 5, o + 8, o + 9, o + 12, o + 13, -1, -1,
                                     -1, -1, -1, -1, -1, -1);
  const __m256i picked = _mm256_shuffle_epi8(nibbles, _mm256_broadcastsi128_si256(half));
  // each half's 8 bytes (rows 0-3, then 4-7) side by side: 64-bit words 0 and 2
  return _mm256_cvtepu8_epi16(_mm256_castsi256_si128(_mm256_permute4x64_epi64(picked, 0x08)));
}

// 32 values of each of 8 rows, Q8_0's bytes or (kType: any other) Q4's nibbles at `values`,
// times the rows' scales d plus their offsets o (a lane a row).
template <int64_t kType>
void dequant_values_x8(const uint8_t* values, __m256 d, __m256 o, float* y, int64_t ldy) {
  // each row's scale and offset twice over, for its pair of lanes: rows 0-3, then 4-7
  const __m256i first = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  const __m256i second = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
  const __m256 d03 = _mm256_permutevar8x32_ps(d, first), d47 = _mm256_permutevar8x32_ps(d, second);
  const __m256 o03 = _mm256_permutevar8x32_ps(o, first), o47 = _mm256_permutevar8x32_ps(o, second);
  // Four rows' 8 values from four vectors of their pairs (p[k]: values 2k, 2k + 1 of each
  // row): a 4 x 4 transpose of 64-bit pairs, then one store a row.
  auto store_rows = [&](const __m256* p, int row, int64_t col) {
    __m256d t[4];
    for (int h = 0; h < 2; ++h) {
      const __m256d a = _mm256_castps_pd(p[2 * h]), c = _mm256_castps_pd(p[2 * h + 1]);
      t[2 * h] = _mm256_unpacklo_pd(a, c);
      t[2 * h + 1] = _mm256_unpackhi_pd(a, c);
    }
    const __m256d r0 = _mm256_permute2f128_pd(t[0], t[2], 0x20);
    const __m256d r1 = _mm256_permute2f128_pd(t[1], t[3], 0x20);
    const __m256d r2 = _mm256_permute2f128_pd(t[0], t[2], 0x31);
    const __m256d r3 = _mm256_permute2f128_pd(t[1], t[3], 0x31);
    _mm256_storeu_ps(y + row * ldy + col, _mm256_castpd_ps(r0));
    _mm256_storeu_ps(y + (row + 1) * ldy + col, _mm256_castpd_ps(r1));
    _mm256_storeu_ps(y + (row + 2) * ldy + col, _mm256_castpd_ps(r2));
    _mm256_storeu_ps(y + (row + 3) * ldy + col, _mm256_castpd_ps(r3));
  };
  for (int chunk = 0; chunk < 4; ++chunk) {
    __m256 first_rows[4], last_rows[4];  // rows 0-3 and 4-7: pairs of values 8 * chunk + 2k
    for (int k = 0; k < 4; ++k) {
      const __m256i pairs = pairs_of<kType>(values, chunk, k);
      const __m256 rows03 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(pairs)));
      const __m256 rows47 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(pairs, 1)));
      first_rows[k] = _mm256_fmadd_ps(d03, rows03, o03);
      last_rows[k] = _mm256_fmadd_ps(d47, rows47, o47);
    }
    store_rows(first_rows, 0, 8 * chunk);
    store_rows(last_rows, 4, 8 * chunk);
  }
}

template <int64_t kType>
void dequant_group_block(const uint8_t* b, float* y, int64_t ldy) {
  const __m256 d = _mm256_cvtph_ps(load16(b));
  const __m256 o = kType == kQ4_1   ? _mm256_cvtph_ps(load16(b + 16))
                   : kType == kQ4_0 ? _mm256_mul_ps(d, _mm256_set1_ps(-8.f))
                                    : _mm256_setzero_ps();
  dequant_values_x8<kType>(b + quant_x8::kRows * quant_x8::scalar_bytes(kType), d, o, y, ldy);
}

// A Q4_K group's super-block: each sub-block's 32 values of the 8 rows, as Q4's.
void dequant_group_block_q4k(const uint8_t* b, float* y, int64_t ldy) {
  for (int j = 0; j < 8; ++j) {
    __m256 d, o;
    quant_x8::q4k_scales(b, j, &d, &o);
    dequant_values_x8<kQ4_0>(b + quant_x8::kQ4KValues + quant_x8::kQ4KSubBytes * j, d, o,
                             y + 32 * j, ldy);
  }
}
#endif

// A group's block through GGUF's layout: its 8 rows' blocks put back, then each dequantized.
inline void dequant_group_block_plain(int64_t ggml_type, const uint8_t* b, float* y,
                                      int64_t ldy) {
  const int64_t bytes = format_of(ggml_type).bytes;
  uint8_t plain[quant_x8::kRows * 144];  // the largest of them (Q4_K)
  quant_x8::convert(b, plain, ggml_type, quant_x8::kRows, bytes, false);
  for (int r = 0; r < quant_x8::kRows; ++r)
    dequant_block(ggml_type, plain + r * bytes, y + r * ldy);
}

// Block j of group g's rows to floats (each row's format_of(ggml_type).values at y + r * ldy),
// whichever interleaved format.
inline void dequant_group_block(int64_t ggml_type, const uint8_t* b, float* y, int64_t ldy) {
#if defined(KV_SIMD) && defined(__F16C__)
  switch (ggml_type) {
    case kQ4_1: return dequant_group_block<kQ4_1>(b, y, ldy);
    case kQ4_0: return dequant_group_block<kQ4_0>(b, y, ldy);
    case kQ8_0: return dequant_group_block<kQ8_0>(b, y, ldy);
    case kQ4_K: return dequant_group_block_q4k(b, y, ldy);
  }
#endif
  dequant_group_block_plain(ggml_type, b, y, ldy);
}

// Groups g0..g1 of 8 interleaved rows of w into out [.., K], float32 or
// bfloat16 (rounded to nearest even on the way out, as dequantize_rows does).
template <class T>
void dequantize_groups(const uint8_t* w, int64_t ggml_type, int64_t K, T* out, int64_t g0,
                       int64_t g1) {
  const Format f = format_of(ggml_type);
  const int64_t blocks = K / f.values, row_bytes = blocks * f.bytes, rows = quant_x8::kRows;
  alignas(64) float y[quant_x8::kRows * 256];  // bfloat16's staging: the largest block (Q4_K)
  for (int64_t g = g0; g < g1; ++g)
    for (int64_t j = 0; j < blocks; ++j) {
      const uint8_t* b = w + g * rows * row_bytes + j * rows * f.bytes;
      T* o = out + g * rows * K + f.values * j;
      const bool direct = std::is_same_v<T, float>;
      float* to = direct ? reinterpret_cast<float*>(o) : y;
      dequant_group_block(ggml_type, b, to, direct ? K : f.values);
      if constexpr (!std::is_same_v<T, float>)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < f.values; i += simd::kWidth)
            simd::store(o + r * K + i, simd::load(y + r * f.values + i));
    }
}

// Rows of an interleaved weight (N of them, from a group's first row) to out [N, K]: its
// groups, then the last N % 8 rows, which are GGUF's.
template <class T>
void dequantize_interleaved(const uint8_t* w, int64_t ggml_type, int64_t K, T* out, int64_t N,
                            bool parallel) {
  const int64_t groups = N / quant_x8::kRows;
  if (parallel)
    kernels::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
      dequantize_groups(w, ggml_type, K, out, g0, g1);
    });
  else
    dequantize_groups(w, ggml_type, K, out, 0, groups);
  dequantize_rows(w, ggml_type, K, out, groups * quant_x8::kRows, N);
}

// Per-32 sums of each row of x [M, K]: the offset terms of every format.
std::vector<float> sums32(const float* x, int64_t M, int64_t K) {
  std::vector<float> xs(M * (K / 32));
  for (int64_t i = 0; i < M * (K / 32); ++i) {
    float s = 0.f;
    for (int j = 0; j < 32; ++j) s += x[i * 32 + j];
    xs[i] = s;
  }
  return xs;
}

#if defined(KV_SIMD)
template <class F>
void gemv_format(const uint8_t* w, int64_t K, const float* x, int64_t M, const float* bias,
                 float* out, int64_t N) {
  const int64_t row_bytes = K / F::kValues * F::kBytes;
  const std::vector<float> xs = sums32(x, M, K);
  // NOTE: up to 4 rows of x share each dequantized weight vector; more rows take more passes.
  kernels::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t m = 0; m < M; m += 4) {
      const float* xm = x + m * K;
      const float* xsm = xs.data() + m * (K / 32);
      float* om = out + m * N;
      switch (std::min<int64_t>(4, M - m)) {
        case 1: gemv_rows<F, 1>(w, row_bytes, K, xm, xsm, bias, om, N, n0, n1); break;
        case 2: gemv_rows<F, 2>(w, row_bytes, K, xm, xsm, bias, om, N, n0, n1); break;
        case 3: gemv_rows<F, 3>(w, row_bytes, K, xm, xsm, bias, om, N, n0, n1); break;
        default: gemv_rows<F, 4>(w, row_bytes, K, xm, xsm, bias, om, N, n0, n1); break;
      }
    }
  });
}
#else
void gemv_scalar(const uint8_t* w, int64_t qtype, int64_t K, const float* x, int64_t M,
                 const float* bias, float* out, int64_t N) {
  kernels::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    std::vector<float> row(K);
    for (int64_t n = n0; n < n1; ++n) {
      dequantize_rows(w + n * (K / format_of(qtype).values * format_of(qtype).bytes), qtype, K,
                      row.data(), 0, 1);
      for (int64_t m = 0; m < M; ++m) {
        float s = bias ? bias[n] : 0.f;
        for (int64_t k = 0; k < K; ++k) s += row[k] * x[m * K + k];
        out[m * N + n] = s;
      }
    }
  });
}
#endif

}  // namespace

int64_t kernels::set_weight_prefetch(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "weight prefetch distance must be 0 or more bytes");
  return std::exchange(quant_blocks::weight_prefetch_bytes, bytes);
}

// out [N, K] float32 or bfloat16 = dequantized(w [N, row_bytes]).
void kernels::quant_dequantize(at::Tensor out, at::Tensor w, int64_t qtype) {
  const int64_t K = out.size(1);
  check_weight(w, qtype, K);
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  TORCH_CHECK((bf16 || out.scalar_type() == at::kFloat) && out.is_contiguous() &&
                  out.size(0) == w.size(0),
              "out: a contiguous float32 or bfloat16 [N, K] tensor");
  const uint8_t* wi = w.data_ptr<uint8_t>();
  if (quant_x8::interleaved(qtype)) {
    const int64_t ggml_type = quant_x8::base_type(qtype);
    if (bf16)
      dequantize_interleaved(wi, ggml_type, K, out.data_ptr<c10::BFloat16>(), w.size(0), true);
    else
      dequantize_interleaved(wi, ggml_type, K, out.data_ptr<float>(), w.size(0), true);
    return;
  }
  kernels::parallel_for(0, w.size(0), 16, [&](int64_t r0, int64_t r1) {
    if (bf16)
      dequantize_rows(wi, qtype, K, out.data_ptr<c10::BFloat16>(), r0, r1);
    else
      dequantize_rows(wi, qtype, K, out.data_ptr<float>(), r0, r1);
  });
}

// out [M, N] float32 = x [M, K] float32 @ dequantized(w [N, row_bytes])^T (+ bias): reads each
// weight once and dequantizes it in registers. For a few rows (decode).
void kernels::quant_gemv(at::Tensor out, at::Tensor x, at::Tensor w, int64_t qtype,
                         c10::optional<at::Tensor> bias) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  check_weight(w, qtype, K);
  TORCH_CHECK(!quant_x8::interleaved(qtype),
              "interleaved rows multiply 16-bit activations (quant_gemv_int), not float ones");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), "x: contiguous float32 [M, K]");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.size(0) == M &&
                  out.size(1) == N,
              "out: contiguous float32 [M, N]");
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const uint8_t* wi = w.data_ptr<uint8_t>();
  const float* xi = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
#if defined(KV_SIMD)
  switch (qtype) {
    case kQ8_0: gemv_format<Q8_0>(wi, K, xi, M, b, o, N); break;
    case kQ4_0: gemv_format<Q4<false>>(wi, K, xi, M, b, o, N); break;
    case kQ4_1: gemv_format<Q4<true>>(wi, K, xi, M, b, o, N); break;
    case kQ5_0: gemv_format<Q5_0>(wi, K, xi, M, b, o, N); break;
    case kQ4_K: gemv_format<Q4_K>(wi, K, xi, M, b, o, N); break;
  }
#else
  gemv_scalar(wi, qtype, K, xi, M, b, o, N);
#endif
}

namespace {

// Rows of a tile: at most `most`, and as many tiles as a multiple of the threads (so no thread
// waits on another's last tile), each a multiple of 16 rows.
int64_t balanced_tile(int64_t N, int64_t most, int64_t threads) {
  const int64_t rounds = (N + most * threads - 1) / (most * threads);
  const int64_t tile = (N + rounds * threads - 1) / (rounds * threads);
  return std::min(N, (tile + 15) / 16 * 16);
}

}  // namespace

// out [M, N] = x @ dequantized(w)^T (+ bias) for many rows (prefill): a tile of weight rows at
// a time is dequantized into a buffer that stays in cache, then multiplied by the library GEMM.
void kernels::quant_gemm(at::Tensor out, at::Tensor x, at::Tensor w, int64_t qtype,
                         c10::optional<at::Tensor> bias, int64_t tile_rows) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  check_weight(w, qtype, K);
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat &&
                  out.is_contiguous() && out.size(0) == M && out.size(1) == N,
              "x [M, K] and out [M, N]: float32");
  TORCH_CHECK(tile_rows > 0, "tile_rows must be positive");
  const int64_t tile = balanced_tile(N, tile_rows, at::get_num_threads());
  const int64_t tiles = (N + tile - 1) / tile, row_bytes = w.size(1);
  // NOTE: each thread takes whole tiles (dequantize, then a one-thread GEMM straight into its
  // columns of out): splitting each small GEMM across threads instead synchronized them twice
  // a tile and scaled poorly at 2 threads (docs/benchmarks.md, "Prefill on two threads").
  const bool inference = c10::InferenceMode::is_enabled();
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    // NOTE: the caller's inference mode is thread-local; its worker threads need it too, or
    // writing into a view of an inference tensor is refused.
    c10::InferenceMode guard(inference);
    at::Tensor buffer = at::empty({tile, K}, x.options());
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * tile, rows = std::min(tile, N - n0);
      const uint8_t* tile_rows = w.data_ptr<uint8_t>() + n0 * row_bytes;
      // NOTE: a tile starts at a multiple of 16 rows: interleaved, its rows are whole groups
      // of 8 (and the weight's last rows), an interleaved weight of their own.
      if (quant_x8::interleaved(qtype))
        dequantize_interleaved(tile_rows, quant_x8::base_type(qtype), K, buffer.data_ptr<float>(),
                               rows, false);
      else
        dequantize_rows(tile_rows, qtype, K, buffer.data_ptr<float>(), 0, rows);
      at::Tensor columns = out.narrow(1, n0, rows);
      at::mm_out(columns, x, buffer.narrow(0, 0, rows).t());
    }
  });
  if (bias.has_value()) out.add_(*bias);
}

// out = w [N, row_bytes] of `qtype` (Q4_0, Q4_1 or Q8_0, without kInterleaved) with its rows
// interleaved 8 at a time (quant_x8.h), or back to GGUF's layout from them.
void kernels::quant_interleave(at::Tensor out, at::Tensor w, int64_t qtype, bool interleave) {
  const int64_t ggml_type = quant_x8::base_type(qtype);
  TORCH_CHECK(quant_x8::can_interleave(ggml_type),
              "only Q4_0, Q4_1, Q8_0 and Q4_K rows interleave, not type ", ggml_type);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous() &&
                  w.size(1) % format_of(ggml_type).bytes == 0,
              "w: contiguous uint8 rows of whole blocks");
  TORCH_CHECK(out.scalar_type() == at::kByte && out.is_contiguous() && out.sizes() == w.sizes() &&
                  out.data_ptr() != w.data_ptr(),
              "out: another contiguous uint8 tensor of w's shape");
  const uint8_t* src = w.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const int64_t N = w.size(0), group_bytes = quant_x8::kRows * w.size(1);
  const int64_t groups = N / quant_x8::kRows;
  kernels::parallel_for(0, groups, 16, [&](int64_t g0, int64_t g1) {
    const int64_t at = g0 * group_bytes, rows = (g1 - g0) * quant_x8::kRows;
    quant_x8::convert(src + at, dst + at, ggml_type, rows, w.size(1), interleave);
  });
  const int64_t tail = groups * group_bytes;  // the last N % 8 rows, copied as they are
  quant_x8::convert(src + tail, dst + tail, ggml_type, N % quant_x8::kRows, w.size(1), interleave);
}

// out [I, K] float32 = rows `index` (int64 [I]) of w dequantized: an embedding's lookup.
// Interleaved rows are read out of their group (the group's block dequantized, one row kept).
void kernels::quant_lookup(at::Tensor out, at::Tensor w, at::Tensor index, int64_t qtype) {
  const int64_t K = out.size(1), N = w.size(0), I = index.numel();
  check_weight(w, qtype, K);
  TORCH_CHECK(index.scalar_type() == at::kLong && index.dim() == 1 && index.is_contiguous(),
              "index: contiguous int64 [I]");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.dim() == 2 && out.is_contiguous() &&
                  out.size(0) == I,
              "out: contiguous float32 [I, K]");
  const int64_t* rows = index.data_ptr<int64_t>();
  for (int64_t i = 0; i < I; ++i)
    TORCH_CHECK(rows[i] >= 0 && rows[i] < N, "row ", rows[i], " is outside the weight's ", N);
  const int64_t ggml_type = quant_x8::base_type(qtype), row_bytes = w.size(1);
  const int64_t grouped = quant_x8::interleaved(qtype) ? N / quant_x8::kRows * quant_x8::kRows : 0;
  const Format f = format_of(ggml_type);
  const uint8_t* wi = w.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  kernels::parallel_for(0, I, 16, [&](int64_t i0, int64_t i1) {
    alignas(64) float y[quant_x8::kRows * 256];  // the largest block (Q4_K)
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t row = rows[i];
      if (row >= grouped) {  // GGUF's layout
        dequantize_rows(wi + row * row_bytes, ggml_type, K, o + i * K, 0, 1);
        continue;
      }
      const uint8_t* group = wi + row / quant_x8::kRows * quant_x8::kRows * row_bytes;
      for (int64_t j = 0; j < K / f.values; ++j) {
        dequant_group_block(ggml_type, group + j * quant_x8::kRows * f.bytes, y, f.values);
        std::memcpy(o + i * K + f.values * j, y + row % quant_x8::kRows * f.values,
                    f.values * sizeof(float));
      }
    }
  });
}
