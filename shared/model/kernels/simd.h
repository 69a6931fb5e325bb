// One float vector type for the kernels, as wide as the build's instruction set: 16 lanes of
// AVX-512, 8 lanes of AVX2 + FMA, or 1 lane (plain C++) elsewhere. Kernels are written once
// against it; shared/model/kernels/__init__.py compiles one build per instruction set.
//
// NOTE: loads widen bf16 in registers (a bf16 is the top half of a float), and stores round
// to nearest even as c10::BFloat16 does, so a kernel's results do not depend on the build
// beyond the order of its float sums.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace simd {

#if defined(__AVX512F__) && defined(__AVX512BW__)
constexpr int64_t kWidth = 16;
using V = __m512;
inline V zero() { return _mm512_setzero_ps(); }
inline V set1(float v) { return _mm512_set1_ps(v); }
inline V load(const float* p) { return _mm512_loadu_ps(p); }
inline V load(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline V load(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline void store(c10::Half* p, V v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
inline V add(V a, V b) { return _mm512_add_ps(a, b); }
inline V sub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V div(V a, V b) { return _mm512_div_ps(a, b); }
inline V max(V a, V b) { return _mm512_max_ps(a, b); }
inline V min(V a, V b) { return _mm512_min_ps(a, b); }
inline V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
inline V round(V v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
// Bit i set where lane i of a equals lane i of b.
inline uint32_t equal_lanes(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
// Lane i of the result: the sum of v[i]'s lanes, for kWidth vectors at once (a transpose by
// halves: pairs of vectors within 128-bit lanes, then the 128-bit lanes).
inline V sum_lanes(const V* v) {
  V u[8], w[4];
  for (int i = 0; i < 8; ++i)
    u[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit lane: vectors 4i..4i+3's partial sums
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const V x = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const V z = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x, z, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x, z, _MM_SHUFFLE(3, 1, 3, 1)));
}
using I = __m512i;
inline I bits(V v) { return _mm512_castps_si512(v); }
inline V from_bits(I i) { return _mm512_castsi512_ps(i); }
inline I to_int(V v) { return _mm512_cvtps_epi32(v); }
inline I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
inline I iand(I a, I b) { return _mm512_and_si512(a, b); }
inline I iset1(int32_t v) { return _mm512_set1_epi32(v); }
template <int S> inline I shr(I a) { return _mm512_srli_epi32(a, S); }
template <int S> inline I shl(I a) { return _mm512_slli_epi32(a, S); }
inline I select_nan(V v, I if_nan, I otherwise) {
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), otherwise, if_nan);
}
// The low 16 bits of each 32-bit lane, packed in order.
inline void store_low16(uint16_t* p, I v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
}
// Lanes holding whole numbers that fit the type, stored as its integers in order.
inline void store_int(int16_t* p, V v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(to_int(v)));
}
inline void store_int(int8_t* p, V v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(to_int(v)));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kWidth = 8;
using V = __m256;
inline V zero() { return _mm256_setzero_ps(); }
inline V set1(float v) { return _mm256_set1_ps(v); }
inline V load(const float* p) { return _mm256_loadu_ps(p); }
inline V load(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline V load(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline void store(c10::Half* p, V v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
inline V add(V a, V b) { return _mm256_add_ps(a, b); }
inline V sub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V mul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V div(V a, V b) { return _mm256_div_ps(a, b); }
inline V max(V a, V b) { return _mm256_max_ps(a, b); }
inline V min(V a, V b) { return _mm256_min_ps(a, b); }
inline V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
inline V round(V v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline float reduce_add(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float reduce_max(V v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline uint32_t equal_lanes(V a, V b) {
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)));
}
// Lane i of the result: the sum of v[i]'s lanes, for kWidth vectors at once.
inline V sum_lanes(const V* v) {
  V u[4], w[2];
  for (int i = 0; i < 4; ++i)
    u[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 2; ++i)  // per 128-bit lane: vectors 4i..4i+3's partial sums
    w[i] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(_mm256_permute2f128_ps(w[0], w[1], 0x20),
                       _mm256_permute2f128_ps(w[0], w[1], 0x31));
}
using I = __m256i;
inline I bits(V v) { return _mm256_castps_si256(v); }
inline V from_bits(I i) { return _mm256_castsi256_ps(i); }
inline I to_int(V v) { return _mm256_cvtps_epi32(v); }
inline I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
inline I iand(I a, I b) { return _mm256_and_si256(a, b); }
inline I iset1(int32_t v) { return _mm256_set1_epi32(v); }
template <int S> inline I shr(I a) { return _mm256_srli_epi32(a, S); }
template <int S> inline I shl(I a) { return _mm256_slli_epi32(a, S); }
inline I select_nan(V v, I if_nan, I otherwise) {
  return _mm256_blendv_epi8(otherwise, if_nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
inline void store_low16(uint16_t* p, I v) {
  // packus works within 128-bit halves: pack the two halves of one vector together.
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
inline __m128i to_int16(V v) {
  const I i = to_int(v);
  return _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
}
inline void store_int(int16_t* p, V v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_int16(v)); }
inline void store_int(int8_t* p, V v) {
  const __m128i words = to_int16(v);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(words, words));
}
#else
constexpr int64_t kWidth = 1;
using V = float;
inline V zero() { return 0.f; }
inline V set1(float v) { return v; }
inline V load(const float* p) { return *p; }
inline V load(const c10::BFloat16* p) { return static_cast<float>(*p); }
inline void store(float* p, V v) { *p = v; }
inline V load(const c10::Half* p) { return static_cast<float>(*p); }
inline void store(c10::BFloat16* p, V v) { *p = c10::BFloat16(v); }
inline void store(c10::Half* p, V v) { *p = c10::Half(v); }
inline V add(V a, V b) { return a + b; }
inline V sub(V a, V b) { return a - b; }
inline V mul(V a, V b) { return a * b; }
inline V div(V a, V b) { return a / b; }
inline V max(V a, V b) { return std::max(a, b); }
inline V min(V a, V b) { return std::min(a, b); }
inline V fmadd(V a, V b, V c) { return a * b + c; }
inline V fnmadd(V a, V b, V c) { return c - a * b; }
inline V round(V v) { return std::nearbyint(v); }
inline float reduce_add(V v) { return v; }
inline float reduce_max(V v) { return v; }
inline V sum_lanes(const V* v) { return v[0]; }
inline uint32_t equal_lanes(V a, V b) { return a == b; }
inline void store_int(int16_t* p, V v) { *p = v == v ? static_cast<int16_t>(v) : 0; }
inline void store_int(int8_t* p, V v) { *p = v == v ? static_cast<int8_t>(v) : 0; }
#endif

#if defined(__AVX2__) && defined(__FMA__)
// float -> bf16, round to nearest even, NaN kept a quiet NaN (as c10::BFloat16(float)).
inline void store(c10::BFloat16* p, V v) {
  const I b = bits(v);
  const I rounded = shr<16>(iadd(b, iadd(iset1(0x7FFF), iand(shr<16>(b), iset1(1)))));
  store_low16(reinterpret_cast<uint16_t*>(p), select_nan(v, iset1(0x7FC0), rounded));
}

// v rounded to bf16 and widened back: what storing and reloading it would give.
inline V round_bf16(V v) {
  const I b = bits(v);
  const I rounded = shr<16>(iadd(b, iadd(iset1(0x7FFF), iand(shr<16>(b), iset1(1)))));
  return from_bits(shl<16>(select_nan(v, iset1(0x7FC0), rounded)));
}

// e^x as 2^n * e^f, |f| <= ln2/2, degree-6 polynomial: relative error about 2e-7 (as expf).
// x is clamped to [-87, 88], where the result stays a normal float.
inline V exp(V x) {
  x = min(max(x, set1(-87.f)), set1(88.f));
  const V n = round(mul(x, set1(1.44269504088896341f)));
  const V f = fnmadd(n, set1(1.428606765330187e-06f), fnmadd(n, set1(0.693145751953125f), x));
  V p = set1(1.f / 720);
  p = fmadd(p, f, set1(1.f / 120));
  p = fmadd(p, f, set1(1.f / 24));
  p = fmadd(p, f, set1(1.f / 6));
  p = fmadd(p, f, set1(0.5f));
  p = fmadd(p, f, set1(1.f));
  p = fmadd(p, f, set1(1.f));
  return from_bits(iadd(bits(p), shl<23>(to_int(n))));
}
#endif

// The scalar twin of exp(V), for tails and the plain C++ build.
inline float exp1(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float f = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.f / 720;
  p = p * f + 1.f / 120;
  p = p * f + 1.f / 24;
  p = p * f + 1.f / 6;
  p = p * f + 0.5f;
  p = p * f + 1.f;
  p = p * f + 1.f;
  int32_t b;
  std::memcpy(&b, &p, 4);
  b += int32_t(n) << 23;
  std::memcpy(&p, &b, 4);
  return p;
}

#if !(defined(__AVX2__) && defined(__FMA__))
inline V exp(V x) { return exp1(x); }
inline V round_bf16(V v) { return static_cast<float>(c10::BFloat16(v)); }
#endif

// Asks L2 for the lines of [p, p + bytes). NOTE: into L2, not L1 (prefetcht0): decode
// attention's slots asked for into L1 gained it little on a Zen 4, whose few L1 miss buffers
// the prefetches filled. And an instruction the compiler must keep: GCC 12 deleted loops of
// __builtin_prefetch over computed addresses as code without effects.
inline void prefetch(const void* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) {
    const char* line = static_cast<const char*>(p) + o;
#if defined(__x86_64__) || defined(_M_X64)
    asm volatile("prefetcht1 %0" : : "m"(*line));
#else
    __builtin_prefetch(line, 0, 2);
#endif
  }
}

// v as the element type T would hold it (a float rounded to T and back).
template <typename T>
inline V as(V v);
template <>
inline V as<float>(V v) { return v; }
template <>
inline V as<c10::BFloat16>(V v) { return round_bf16(v); }
template <>
inline V as<c10::Half>(V v) {
  alignas(64) c10::Half tmp[kWidth];
  store(tmp, v);
  return load(tmp);
}

}  // namespace simd
