// Batch normalization over [N, C, HW] (or [N, HW, C] channels last, the same
// arithmetic in the same order through BatchNormGeometry::base/step, so both
// layouts give the same bits): statistics per channel. Channels are
// the parallel axis; each channel's sums run in double over its values in
// (image, position) order, so results do not depend on the thread count.
// The conventions are cuDNN's (and PyTorch's): the batch variance that
// normalizes is biased (divided by N * HW), the one folded into the running
// variance is unbiased (divided by N * HW - 1), and
//   running = (1 - momentum) * running + momentum * batch statistic.
#include <cmath>
#include <string>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"
#include "weft/error.h"

namespace weft::kernels::cpu {
namespace {

void check(const BatchNormGeometry& g, const char* op) {
  if (g.n < 0 || g.c < 0 || g.hw < 0)
    throw Error(std::string(op) + ": invalid geometry (n " + std::to_string(g.n) + ", c " + std::to_string(g.c) +
                ", hw " + std::to_string(g.hw) + ")");
}


template <class Body>
void parallel_channels(const BatchNormGeometry& g, const Body& body) {
  detail::parallel_for(g.c, detail::grain_for(4 * g.per_channel()), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t c = lo; c < hi; ++c) body(c);
  });
}

}  // namespace

void batch_norm_forward_train(float* y, float* save_mean, float* save_invstd, float* running_mean,
                              float* running_var, const float* x, const float* gamma, const float* beta,
                              const BatchNormGeometry& g, float eps, float momentum) {
  check(g, "batch_norm_forward_train");
  const std::int64_t m = g.per_channel();
  if (m < 2) throw Error("batch_norm_forward_train: training needs at least 2 values per channel, got " + std::to_string(m));
  parallel_channels(g, [&](std::int64_t c) {
    const std::int64_t st = g.step();
    double s = 0.0;
    for (std::int64_t i = 0; i < g.n; ++i) {
      const float* p = x + g.base(i, c);
      for (std::int64_t j = 0; j < g.hw; ++j) s += p[j * st];
    }
    const double mean = s / static_cast<double>(m);
    double ss = 0.0;  // second pass: no cancellation of large means
    for (std::int64_t i = 0; i < g.n; ++i) {
      const float* p = x + g.base(i, c);
      for (std::int64_t j = 0; j < g.hw; ++j) {
        const double d = p[j * st] - mean;
        ss += d * d;
      }
    }
    const double var = ss / static_cast<double>(m);
    const double invstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    // y = (x - mean) * scale + beta: subtracting first keeps a large mean
    // from cancelling against the shift.
    const float meanf = static_cast<float>(mean), scale = static_cast<float>(gamma[c] * invstd), shift = beta[c];
    for (std::int64_t i = 0; i < g.n; ++i) {
      const float* xp = x + g.base(i, c);
      float* yp = y + g.base(i, c);
      for (std::int64_t j = 0; j < g.hw; ++j) yp[j * st] = (xp[j * st] - meanf) * scale + shift;
    }
    save_mean[c] = static_cast<float>(mean);
    save_invstd[c] = static_cast<float>(invstd);
    const double mo = momentum;
    running_mean[c] = static_cast<float>((1.0 - mo) * running_mean[c] + mo * mean);
    running_var[c] =
        static_cast<float>((1.0 - mo) * running_var[c] + mo * ss / static_cast<double>(m - 1));
  });
}

void batch_norm_forward_infer(float* y, const float* x, const float* gamma, const float* beta,
                              const float* running_mean, const float* running_var, const BatchNormGeometry& g,
                              float eps) {
  check(g, "batch_norm_forward_infer");
  parallel_channels(g, [&](std::int64_t c) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + static_cast<double>(eps));
    const float mean = running_mean[c], scale = static_cast<float>(gamma[c] * invstd), shift = beta[c];
    const std::int64_t st = g.step();
    for (std::int64_t i = 0; i < g.n; ++i) {
      const float* xp = x + g.base(i, c);
      float* yp = y + g.base(i, c);
      for (std::int64_t j = 0; j < g.hw; ++j) yp[j * st] = (xp[j * st] - mean) * scale + shift;
    }
  });
}

void batch_norm_backward(float* dx, float* dgamma, float* dbeta, const float* x, const float* dy, const float* gamma,
                         const float* save_mean, const float* save_invstd, const BatchNormGeometry& g) {
  check(g, "batch_norm_backward");
  const std::int64_t m = g.per_channel();
  parallel_channels(g, [&](std::int64_t c) {
    const double mean = save_mean[c], invstd = save_invstd[c];
    // dbeta = sum dy, dgamma = sum dy * xhat with xhat = (x - mean) * invstd.
    const std::int64_t st = g.step();
    double sdy = 0.0, sdyx = 0.0;
    for (std::int64_t i = 0; i < g.n; ++i) {
      const float* xp = x + g.base(i, c);
      const float* dyp = dy + g.base(i, c);
      for (std::int64_t j = 0; j < g.hw; ++j) {
        sdy += dyp[j * st];
        sdyx += dyp[j * st] * (xp[j * st] - mean);
      }
    }
    dbeta[c] = static_cast<float>(sdy);
    dgamma[c] = static_cast<float>(sdyx * invstd);
    if (m == 0) return;
    // dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat))
    //    = a * dy + b * (x - mean) + k, per channel.
    const double inv_m = 1.0 / static_cast<double>(m);
    const double gi = gamma[c] * invstd;
    const float a = static_cast<float>(gi);
    const float b = static_cast<float>(-gi * invstd * invstd * sdyx * inv_m);
    const float k = static_cast<float>(-gi * sdy * inv_m);
    const float meanf = static_cast<float>(mean);
    for (std::int64_t i = 0; i < g.n; ++i) {
      const float* xp = x + g.base(i, c);
      const float* dyp = dy + g.base(i, c);
      float* dxp = dx + g.base(i, c);
      for (std::int64_t j = 0; j < g.hw; ++j) dxp[j * st] = a * dyp[j * st] + b * (xp[j * st] - meanf) + k;
    }
  });
}

}  // namespace weft::kernels::cpu
