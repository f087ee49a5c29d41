// Fully connected layer: the products go to gemm, the bias is a row loop.
#include <algorithm>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"

namespace weft::kernels::cpu {

void dense_forward(float* y, const float* x, const float* w, const float* b, std::int64_t batch, std::int64_t in,
                   std::int64_t out) {
  if (batch <= 0 || out <= 0) return;
  // The bias goes in first and gemm accumulates onto it (beta = 1): one pass
  // over y instead of two.
  if (b) {
    detail::parallel_for(batch, detail::grain_for(out), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) std::copy(b, b + out, y + r * out);
    });
  }
  gemm(false, true, batch, out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y, out);
}

void dense_backward(float* dx, float* dw, float* db, const float* x, const float* w, const float* dy,
                    std::int64_t batch, std::int64_t in, std::int64_t out) {
  if (dx) gemm(false, false, batch, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  if (dw) gemm(true, false, out, in, batch, 1.0f, dy, out, x, in, 0.0f, dw, in);
  if (db && out > 0) {
    // Column sums, walked row by row so each piece of columns streams through
    // dy in order; accumulated in double, rows always in the same order.
    detail::parallel_for(out, detail::grain_for(batch), [&](std::int64_t lo, std::int64_t hi) {
      std::vector<double> acc(static_cast<std::size_t>(hi - lo), 0.0);
      for (std::int64_t r = 0; r < batch; ++r) {
        const float* row = dy + r * out;
        for (std::int64_t o = lo; o < hi; ++o) acc[static_cast<std::size_t>(o - lo)] += row[o];
      }
      for (std::int64_t o = lo; o < hi; ++o) db[o] = static_cast<float>(acc[static_cast<std::size_t>(o - lo)]);
    });
  }
}

}  // namespace weft::kernels::cpu
