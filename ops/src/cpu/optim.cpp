// The optimizer step and the gradient-norm reduction on raw float32 buffers
// (optim_math.h's arithmetic, shared with the CUDA kernels).
#include <algorithm>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"

namespace weft::kernels::cpu {

void optimizer_step(const OptimizerHyper& h, const OptimizerTensor* tensors, std::size_t count,
                    const float* grad_scale, const float* skip) {
  if (skip && *skip != 0.0f) return;
  const float scale = grad_scale ? *grad_scale : 1.0f;
  for (std::size_t k = 0; k < count; ++k) {
    const OptimizerTensor& p = tensors[k];
    const optim_math::StepConstants c = optim_math::constants(h, p.step ? *p.step : 0.0f);
    detail::parallel_for(p.n, detail::grain_for(8), [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) optim_math::update(h, c, p, scale, i);
    });
    if (p.step) *p.step += 1.0f;
  }
}

void sum_squares(float* y, const float* const* xs, const std::int64_t* ns, std::size_t count) {
  // Fixed chunks per tensor whose partial sums are added in order: the same
  // bits for every thread count and run.
  constexpr std::int64_t kChunk = 1 << 14;
  double total = 0.0;
  std::vector<double> partial;
  for (std::size_t k = 0; k < count; ++k) {
    const float* x = xs[k];
    const std::int64_t n = ns[k];
    const std::int64_t chunks = n > 0 ? (n + kChunk - 1) / kChunk : 0;
    partial.assign(static_cast<std::size_t>(chunks), 0.0);
    detail::parallel_for(chunks, detail::grain_for(kChunk), [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t c = b; c < e; ++c) {
        const std::int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
        double s = 0.0;
        for (std::int64_t i = lo; i < hi; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
        partial[static_cast<std::size_t>(c)] = s;
      }
    });
    for (double p : partial) total += p;
  }
  *y = static_cast<float>(total);
}

void clip_coefficient(float* coef, const float* norm_sq, float max_norm) {
  *coef = optim_math::clip_coefficient(*norm_sq, max_norm);
}

}  // namespace weft::kernels::cpu
