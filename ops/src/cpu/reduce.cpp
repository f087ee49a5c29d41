// Reductions.
#include <algorithm>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"

namespace weft::kernels::cpu {

void sum(float* y, const float* x, std::int64_t n) {
  // Fixed chunks whose partial sums are added in chunk order: the rounding,
  // hence the result, is the same for every thread count and every run.
  constexpr std::int64_t kChunk = 1 << 14;
  const std::int64_t chunks = n > 0 ? (n + kChunk - 1) / kChunk : 0;
  std::vector<double> partial(static_cast<std::size_t>(chunks));
  detail::parallel_for(chunks, detail::grain_for(kChunk), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t c = b; c < e; ++c) {
      const std::int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
      double s = 0.0;
      for (std::int64_t i = lo; i < hi; ++i) s += x[i];
      partial[static_cast<std::size_t>(c)] = s;
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  *y = static_cast<float>(total);
}

void argmax_rows(float* y, const float* x, std::int64_t rows, std::int64_t cols) {
  detail::parallel_for(rows, detail::grain_for(cols), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      if (cols <= 0) {
        y[r] = -1.0f;  // an empty row has no largest element
        continue;
      }
      const float* row = x + r * cols;
      std::int64_t best = 0;
      for (std::int64_t j = 1; j < cols; ++j)
        if (row[j] > row[best]) best = j;  // strict: ties keep the lowest index
      y[r] = static_cast<float>(best);
    }
  });
}

}  // namespace weft::kernels::cpu
