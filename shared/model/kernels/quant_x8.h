// Q4_0, Q4_1, Q8_0 and Q4_K weights with 8 rows interleaved ("x8"), for the GEMV on integer
// activations (quant_dot.cpp). A weight's type code carries kInterleaved beside the GGML type.
//
// Why: in GGUF's own layout each row is a run of blocks, and the GEMV on one row of x spent
// more of a core converting each block's scales and summing each block's products across a
// vector than multiplying: it was bound by the core, not by memory (`python -m bench gemv`).
// With 8 rows side by side, a vector's 8 int32 lanes are 8 rows: the products of a block land
// in one lane per row, and one conversion, one multiply and one FMA scale 8 rows' blocks at
// once (llama.cpp's CPU repacking does the same for its 8-bit activations).
//
// Layout of a group of 8 rows (r = 0..7), block j of 32 values, 8 * kBytes bytes: fp16 d[8],
// then (Q4_1) fp16 m[8], then the values:
//   Q4: 4 chunks c of 32 bytes; byte 4r + t of chunk c holds value 8c + t of row r in its low
//       nibble and value 8c + 4 + t in its high one (t = 0..3): the low (or high) nibbles of
//       a chunk are, in each 32-bit lane, 4 values of one row, what one VNNI dot product
//       (_mm256_dpbusd_epi32) multiplies by 4 broadcast bytes of x and sums.
//   Q8_0: 16 chunks p of 16 bytes; byte 2r + h of chunk p is value 2p + h of row r: widened
//       to 16 bits, each pair of lanes is what _mm256_madd_epi16 multiplies by a broadcast
//       pair of 16-bit x, each row's two products summed in its own 32-bit lane.
// Q4_K: a super-block of 256 values a row (fp16 d and dmin, 12 bytes of 6-bit scales and mins,
// 128 bytes of nibbles) becomes 8 rows' side by side, 8 * 144 bytes: fp16 d[8], fp16 dmin[8],
// byte k of the 12 of row r at 32 + 8k + r (one 8-byte load a byte's 8 rows), then the 8
// sub-blocks of 32 values, 128 bytes each, laid out as a Q4 block's values above.
// Groups follow each other: group g sits where GGUF's rows 8g..8g+7 sat (8 * row_bytes bytes),
// so rows n0..n1 of a weight, n0 a multiple of 8 and n1 one too or the last row, are an
// interleaved weight of their own. The last N % 8 rows stay as they are in GGUF.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#endif

#include "quant_blocks.h"

namespace quant_x8 {

using quant_blocks::can_interleave;
using quant_blocks::kInterleaved;
using quant_blocks::kQ4_0;
using quant_blocks::kQ4_1;
using quant_blocks::kQ4_K;
using quant_blocks::kQ8_0;

constexpr int64_t kRows = 8;
// Where a Q4_K super-block's scale bytes and its sub-blocks' values start within its group's.
constexpr int64_t kQ4KScales = 32, kQ4KValues = 128, kQ4KSubBytes = 128;

inline bool interleaved(int64_t qtype) { return (qtype & kInterleaved) != 0; }
inline int64_t base_type(int64_t qtype) { return qtype & ~kInterleaved; }
// Bytes of a block's scalars (d, then m for Q4_1) before its values.
inline int64_t scalar_bytes(int64_t ggml_type) { return ggml_type == kQ4_1 ? 4 : 2; }

// Where value i of row r sits among a group's block's values: the byte, and the shift of
// its nibble there (Q4; 0 for Q8_0's bytes).
inline void place_of(int64_t ggml_type, int r, int i, int64_t* byte, int* shift) {
  if (ggml_type == kQ8_0) {
    *byte = 16 * (i / 2) + 2 * r + i % 2;
    *shift = 0;
    return;
  }
  const int chunk = i / 8, k = i % 8;
  *byte = 32 * chunk + 4 * r + k % 4;
  *shift = 4 * (k / 4);
}

// Where value i of a row sits among a GGUF block's values: Q4's value i < 16 in the low nibble
// of byte i, i >= 16 in the high one of byte i - 16; Q8_0's in byte i.
inline void plain_place_of(int64_t ggml_type, int i, int64_t* byte, int* shift) {
  const bool q8 = ggml_type == kQ8_0;
  *byte = q8 ? i : i % 16;
  *shift = q8 || i < 16 ? 0 : 4;
}

// Moves `bits` at `shift` of one byte to those at another, either way: plain -> x8 or back.
inline void move_bits(const uint8_t* src, uint8_t* dst, int64_t plain_at, int plain_shift,
                      int64_t x8_at, int x8_shift, int mask, bool to_interleaved) {
  const auto put = [mask](uint8_t* b, int s, int v) {
    *b = static_cast<uint8_t>((*b & ~(mask << s)) | (v << s));
  };
  if (to_interleaved) put(dst + x8_at, x8_shift, (src[plain_at] >> plain_shift) & mask);
  else put(dst + plain_at, plain_shift, (src[x8_at] >> x8_shift) & mask);
}

// convert() for Q4_K's whole groups of 8 rows.
inline void convert_q4_k(const uint8_t* src, uint8_t* dst, int64_t groups, int64_t row_bytes,
                         bool to_interleaved) {
  const int64_t bytes = quant_blocks::format_of(kQ4_K).bytes, supers = row_bytes / bytes;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < supers; ++j) {
      const int64_t group_block = g * kRows * row_bytes + j * kRows * bytes;
      for (int r = 0; r < kRows; ++r) {
        const int64_t plain = g * kRows * row_bytes + r * row_bytes + j * bytes;
        for (int64_t s = 0; s < 4; ++s)  // d, then dmin: each an array of 8 fp16
          move_bits(src, dst, plain + s, 0, group_block + (s / 2) * 2 * kRows + 2 * r + s % 2,
                    0, 0xFF, to_interleaved);
        for (int64_t k = 0; k < 12; ++k)
          move_bits(src, dst, plain + 4 + k, 0, group_block + kQ4KScales + kRows * k + r, 0,
                    0xFF, to_interleaved);
        for (int sub = 0; sub < 8; ++sub)
          for (int i = 0; i < 32; ++i) {
            int64_t at;
            int shift;
            place_of(kQ4_0, r, i, &at, &shift);
            move_bits(src, dst, plain + 16 + 32 * (sub / 2) + i, 4 * (sub % 2),
                      group_block + kQ4KValues + kQ4KSubBytes * sub + at, shift, 0x0F,
                      to_interleaved);
          }
      }
    }
  }
}

#if defined(__AVX2__) && defined(__F16C__)
// Sub-block j's scale d * sc and offset -dmin * mn in a Q4_K group's super-block `b`, a lane a
// row: the 6-bit sc and mn unpacked as quant_blocks::q4k_scale_min does, 8 rows at once.
inline void q4k_scales(const uint8_t* b, int j, __m256* d, __m256* offset) {
  const auto byte = [b](int k) {  // byte k of the 12 of each row
    return _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + kQ4KScales + kRows * k)));
  };
  const __m256i six = _mm256_set1_epi32(63), four = _mm256_set1_epi32(15);
  __m256i sc, mn;
  if (j < 4) {
    sc = _mm256_and_si256(byte(j), six);
    mn = _mm256_and_si256(byte(j + 4), six);
  } else {
    const __m256i low = byte(j + 4);
    sc = _mm256_or_si256(_mm256_and_si256(low, four),
                         _mm256_slli_epi32(_mm256_srli_epi32(byte(j - 4), 6), 4));
    mn = _mm256_or_si256(_mm256_srli_epi32(low, 4),
                         _mm256_slli_epi32(_mm256_srli_epi32(byte(j), 6), 4));
  }
  const auto half8 = [](const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  };
  *d = _mm256_mul_ps(half8(b), _mm256_cvtepi32_ps(sc));
  *offset = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(half8(b + 16), _mm256_cvtepi32_ps(mn)));
}
#endif

// convert() for the 32-value formats' (Q4_0, Q4_1, Q8_0) whole groups of 8 rows.
inline void convert_blocks(const uint8_t* src, uint8_t* dst, int64_t ggml_type, int64_t groups,
                           int64_t row_bytes, bool to_interleaved) {
  const int64_t scalars = scalar_bytes(ggml_type), bytes = quant_blocks::format_of(ggml_type).bytes;
  const int mask = ggml_type == kQ8_0 ? 0xFF : 0x0F;
  const int64_t blocks = row_bytes / bytes;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < blocks; ++j) {
      const int64_t group_block = g * kRows * row_bytes + j * kRows * bytes;
      const int64_t values = group_block + kRows * scalars;
      for (int r = 0; r < kRows; ++r) {
        const int64_t plain = g * kRows * row_bytes + r * row_bytes + j * bytes;
        for (int64_t s = 0; s < scalars; s += 2) {  // d (and m): each an array of 8 fp16
          const int64_t x8 = group_block + s * kRows + 2 * r;
          if (to_interleaved) std::memcpy(dst + x8, src + plain + s, 2);
          else std::memcpy(dst + plain + s, src + x8, 2);
        }
        for (int i = 0; i < 32; ++i) {
          int64_t at, plain_at;
          int shift, plain_shift;
          place_of(ggml_type, r, i, &at, &shift);
          plain_place_of(ggml_type, i, &plain_at, &plain_shift);
          move_bits(src, dst, plain + scalars + plain_at, plain_shift, values + at, shift, mask,
                    to_interleaved);
        }
      }
    }
  }
}

// Converts N rows of row_bytes between GGUF's layout (plain) and the interleaved one; the two
// are the same bytes in another order. The last N % 8 rows are GGUF's either way.
inline void convert(const uint8_t* src, uint8_t* dst, int64_t ggml_type, int64_t N,
                    int64_t row_bytes, bool to_interleaved) {
  const int64_t groups = N / kRows;
  if (ggml_type == kQ4_K)
    convert_q4_k(src, dst, groups, row_bytes, to_interleaved);
  else
    convert_blocks(src, dst, ggml_type, groups, row_bytes, to_interleaved);
  const int64_t tail = groups * kRows * row_bytes;
  std::memcpy(dst + tail, src + tail, (N % kRows) * row_bytes);
}

}  // namespace quant_x8
