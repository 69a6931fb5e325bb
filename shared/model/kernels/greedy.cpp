// A greedy step's choice: each row's first maximum over the vocabulary, and whether the row
// can be sampled at all (shared/engine/sampler.py). One native call in place of numpy's
// argmax, gather, isfinite and two lists: after a decode step has streamed the weights
// through every cache, each of those small calls paid cold misses (the sampling phase of a
// batch-1 step: `python -m bench step-phases`, docs/benchmarks.md).
#include <ATen/core/Tensor.h>

#include "kernels.h"
#include "simd.h"

#include <cmath>
#include <tuple>
#include <vector>

namespace {

using simd::kWidth;
using simd::V;

// Whether every value of row[0:n] is finite (none masked to -inf either), and the largest of
// them when they all are.
bool all_finite(const float* row, int64_t n, float* most) {
  V top = simd::set1(-INFINITY), poison = simd::zero();
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const V x = simd::load(row + i);
    top = simd::max(top, x);
    poison = simd::add(poison, simd::mul(x, simd::zero()));  // NaN for NaN or +-inf
  }
  float best = simd::reduce_max(top), sum = simd::reduce_add(poison);
  for (; i < n; ++i) {
    best = row[i] > best ? row[i] : best;
    sum += row[i] * 0.0f;
  }
  *most = best;
  return std::isfinite(sum);
}

// numpy's argmax of a row: the first maximum, or the first NaN where there is one.
int64_t first_max(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(row[i])) return i;
    if (row[i] > row[best]) best = i;
  }
  return best;
}

// The first i with row[i] == value (one there is).
int64_t first_equal(const float* row, int64_t n, float value) {
  const V target = simd::set1(value);
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const uint32_t hits = simd::equal_lanes(simd::load(row + i), target);
    if (hits != 0) return i + __builtin_ctz(hits);
  }
  while (row[i] != value) ++i;
  return i;
}

}  // namespace

std::tuple<std::vector<int64_t>, std::vector<bool>> kernels::greedy_rows(at::Tensor logits) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat &&
                  logits.dim() == 2 && logits.is_contiguous() && logits.size(1) > 0,
              "greedy_rows: logits must be a contiguous CPU float32 [rows, vocab] tensor, got ",
              logits.scalar_type(), " ", logits.sizes());
  const int64_t rows = logits.size(0), n = logits.size(1);
  std::vector<int64_t> chosen(rows);
  std::vector<bool> usable(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data_ptr<float>() + r * n;
    float most;
    if (!all_finite(row, n, &most)) {  // masked (-inf) or broken values: the exact scan
      chosen[r] = first_max(row, n);
      usable[r] = std::isfinite(row[chosen[r]]);
      continue;
    }
    chosen[r] = first_equal(row, n, most);
    usable[r] = true;
  }
  return {chosen, usable};
}
