// What every kernel on GGUF blocks needs to read them: the GGML type codes, fp16 scales, Q4_K's
// packed 6-bit scales, and the check that a weight tensor holds rows of a format. Block
// layouts: quant_ops.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace quant_blocks {

constexpr int64_t kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12;  // GGMLQuantizationType
// Or-ed into a type code: its rows interleaved 8 at a time (quant_x8.h), for these formats.
constexpr int64_t kInterleaved = 1 << 8;
inline bool can_interleave(int64_t ggml_type) {
  return ggml_type == kQ4_0 || ggml_type == kQ4_1 || ggml_type == kQ8_0 || ggml_type == kQ4_K;
}

inline float half_to_float(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return c10::detail::fp16_ieee_to_fp32_value(bits);
#endif
}

#if defined(__F16C__)
// A Q4_1 block's d and m, its first two fp16 values, as [d, m, 0, 0]: one conversion.
inline __m128 q4_1_scale_min(const uint8_t* b) {
  int32_t both;
  std::memcpy(&both, b, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(both));
}
#endif

// A Q4 block's scale d and offset: m (Q4_1), or -8 d (Q4_0).
// NOTE: Q4_1's two fp16 values are adjacent: one vector conversion takes both, where two
// scalar ones cost the 8-bit GEMV about a tenth of its time on weights in cache.
template <bool kHasMin>
inline void q4_scale_offset(const uint8_t* b, float* d, float* offset) {
#if defined(__F16C__)
  if constexpr (kHasMin) {
    const __m128 dm = q4_1_scale_min(b);
    *d = _mm_cvtss_f32(dm);
    *offset = _mm_cvtss_f32(_mm_movehdup_ps(dm));
    return;
  }
#endif
  *d = half_to_float(b);
  *offset = kHasMin ? half_to_float(b + 2) : -8.f * *d;
}

// The 6-bit scale and min of Q4_K sub-block j (ggml's get_scale_min_k4).
inline void q4k_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// NOTE: a GEMV streams its weight once, row after row, and on some CPUs the hardware
// prefetcher does not run far enough ahead: the GEMVs on 30 layers' weights (out of cache) ran
// 1.3-2.6x faster at 1-8 rows on a Xeon once each row asked for the bytes this far ahead of it
// (`python -m bench gemv --prefetch 0,2048`: docs/notes/2026-11-26-amx-xeon.md, "Prefetching weights").
// With the weights in one arena of huge pages (shared/model/weight_arena.py), 2, 4 and 8 KiB
// differed by no more than the machine's noise (`python -m bench gemv --arena --prefetch
// 2048,4096,8192`: docs/notes/2026-11-26-amx-xeon.md, "Decode's weights in huge pages").
// One value for the whole module (kernels::set_weight_prefetch); 0 asks for nothing.
inline int64_t weight_prefetch_bytes = 2048;

// Asks the caches for the `bytes` bytes that start weight_prefetch_bytes past `p`, a line at
// a time; called once per weight row with the row's length, so the stream stays that far ahead.
inline void prefetch_row(const void* p, int64_t bytes) {
  if (weight_prefetch_bytes == 0) return;
  const char* ahead = static_cast<const char*>(p) + weight_prefetch_bytes;
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(ahead + o, 0, 3);
}

// Q5_0: fp16 d, 4 bytes whose bit i is the fifth bit of value i, then Q4_0's 16 bytes of
// nibbles (value i low in byte i, value i + 16 high): x = d * (q - 16), q in 0..31.
inline uint32_t q5_0_fifth_bits(const uint8_t* b) {
  uint32_t bits;
  std::memcpy(&bits, b + 2, 4);
  return bits;
}

inline int q5_0_value(const uint8_t* b, int i) {
  const int nibble = i < 16 ? b[6 + i] & 0x0F : b[6 + i - 16] >> 4;
  return nibble | static_cast<int>((q5_0_fifth_bits(b) >> i & 1u) << 4);
}

#if defined(__AVX2__)
// Byte i = 16 where bit i of `bits` is set, else 0 (i < 16).
inline __m128i fifth_bits16(uint32_t bits) {
  const __m128i spread = _mm_shuffle_epi8(_mm_cvtsi32_si128(static_cast<int>(bits)),
                                          _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
  const __m128i select = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
  return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(spread, select), select), _mm_set1_epi8(16));
}

// A Q5_0 block's 32 quants as bytes: values 0-15 in *lo, 16-31 in *hi.
inline void q5_0_quants(const uint8_t* b, __m128i* lo, __m128i* hi) {
  const uint32_t bits = q5_0_fifth_bits(b);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6));
  const __m128i nibble = _mm_set1_epi8(0x0F);
  *lo = _mm_or_si128(_mm_and_si128(raw, nibble), fifth_bits16(bits));
  *hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(raw, 4), nibble), fifth_bits16(bits >> 16));
}
#endif

struct Format {
  int64_t values, bytes;
};

inline Format format_of(int64_t qtype) {
  switch (qtype & ~kInterleaved) {
    case kQ8_0: return {32, 34};
    case kQ4_0: return {32, 18};
    case kQ4_1: return {32, 20};
    case kQ5_0: return {32, 22};
    case kQ4_K: return {256, 144};
  }
  TORCH_CHECK(false, "unsupported GGML quantization type ", qtype);
}

inline void check_weight(const at::Tensor& w, int64_t qtype, int64_t K) {
  const Format f = format_of(qtype);
  TORCH_CHECK(!(qtype & kInterleaved) || can_interleave(qtype & ~kInterleaved),
              "only Q4_0, Q4_1, Q8_0 and Q4_K rows come interleaved, not type ", qtype & ~kInterleaved);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous(),
              "weight: a contiguous uint8 [N, row_bytes] tensor");
  TORCH_CHECK(K % f.values == 0 && w.size(1) == K / f.values * f.bytes,
              "weight rows of ", w.size(1), " bytes do not hold ", K, " values of type ", qtype);
}

}  // namespace quant_blocks
