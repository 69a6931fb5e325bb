// Q4_0, Q4_1 and Q8_0 weights with 8 rows interleaved ("x8"), for the GEMV on 16-bit
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
// then (Q4_1) fp16 m[8], then the values, so that 16-bit lane 2r + h of what one instruction
// or two widen holds value i = 2p + h of row r, for the pair p = 0..15:
//   Q4: 4 chunks c of 32 bytes = 16 uint16 words; nibble k (bits 4k..4k+3) of word 2r + h of
//       chunk c is value 2 * (4c + k) + h of row r (pair p = 4c + k).
//   Q8_0: 16 chunks p of 16 bytes; byte 2r + h of chunk p is value 2p + h of row r.
// Each pair of lanes is what _mm256_madd_epi16 multiplies by a broadcast pair of x, each
// row's two products summed in its own 32-bit lane.
// Groups follow each other: group g sits where GGUF's rows 8g..8g+7 sat (8 * row_bytes bytes),
// so rows n0..n1 of a weight, n0 a multiple of 8 and n1 one too or the last row, are an
// interleaved weight of their own. The last N % 8 rows stay as they are in GGUF.
#pragma once

#include <cstdint>
#include <cstring>

#include "quant_blocks.h"

namespace quant_x8 {

using quant_blocks::can_interleave;
using quant_blocks::kInterleaved;
using quant_blocks::kQ4_1;
using quant_blocks::kQ8_0;

constexpr int64_t kRows = 8;

inline bool interleaved(int64_t qtype) { return (qtype & kInterleaved) != 0; }
inline int64_t base_type(int64_t qtype) { return qtype & ~kInterleaved; }
// Bytes of a block's scalars (d, then m for Q4_1) before its values.
inline int64_t scalar_bytes(int64_t ggml_type) { return ggml_type == kQ4_1 ? 4 : 2; }

// Where value i of row r sits among a group's block's values: the byte, and the shift of
// its nibble there (Q4; 0 for Q8_0's bytes).
inline void place_of(int64_t ggml_type, int r, int i, int64_t* byte, int* shift) {
  const int pair = i / 2, h = i % 2;
  if (ggml_type == kQ8_0) {
    *byte = 16 * pair + 2 * r + h;
    *shift = 0;
    return;
  }
  const int chunk = pair / 4, k = pair % 4;
  *byte = 32 * chunk + 2 * (2 * r + h) + k / 2;  // little-endian words: nibbles 0-1, then 2-3
  *shift = 4 * (k % 2);
}

// Where value i of a row sits among a GGUF block's values: Q4's value i < 16 in the low nibble
// of byte i, i >= 16 in the high one of byte i - 16; Q8_0's in byte i.
inline void plain_place_of(int64_t ggml_type, int i, int64_t* byte, int* shift) {
  const bool q8 = ggml_type == kQ8_0;
  *byte = q8 ? i : i % 16;
  *shift = q8 || i < 16 ? 0 : 4;
}

// Converts N rows of row_bytes between GGUF's layout (plain) and the interleaved one; the two
// are the same bytes in another order.
inline void convert(const uint8_t* src, uint8_t* dst, int64_t ggml_type, int64_t N,
                    int64_t row_bytes, bool to_interleaved) {
  const int64_t scalars = scalar_bytes(ggml_type), bytes = quant_blocks::format_of(ggml_type).bytes;
  const int mask = ggml_type == kQ8_0 ? 0xFF : 0x0F;
  const int64_t blocks = row_bytes / bytes, groups = N / kRows;
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
          plain_at += plain + scalars;
          at += values;
          const auto put = [mask](uint8_t* b, int s, int v) {
            *b = static_cast<uint8_t>((*b & ~(mask << s)) | (v << s));
          };
          if (to_interleaved) put(dst + at, shift, (src[plain_at] >> plain_shift) & mask);
          else put(dst + plain_at, plain_shift, (src[at] >> shift) & mask);
        }
      }
    }
  }
  const int64_t tail = groups * kRows * row_bytes;
  std::memcpy(dst + tail, src + tail, (N - groups * kRows) * row_bytes);
}

}  // namespace quant_x8
