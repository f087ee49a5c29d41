// Creation kernels that need no randomness: constant fill and copy.
#include <algorithm>
#include <cstring>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"

namespace weft::kernels::cpu {

void fill(float* y, std::int64_t n, float value) {
  detail::parallel_for(n, detail::grain_for(1), [&](std::int64_t b, std::int64_t e) { std::fill(y + b, y + e, value); });
}

void copy(float* y, const float* x, std::int64_t n) {
  if (y == x) return;  // memcpy onto itself is undefined, and there is nothing to do
  detail::parallel_for(n, detail::grain_for(1), [&](std::int64_t b, std::int64_t e) {
    std::memcpy(y + b, x + b, static_cast<std::size_t>(e - b) * sizeof(float));
  });
}

}  // namespace weft::kernels::cpu
