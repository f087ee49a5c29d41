// Batch normalization over [N, C, HW] (or [N, HW, C] channels last: blocks of
// channels walk the rows, each channel's arithmetic in the same order as
// NCHW's, so both layouts give the same bits): statistics per channel. Channels are
// the parallel axis; each channel's sums run in double over its values in
// (image, position) order, so results do not depend on the thread count.
// The conventions are cuDNN's (and PyTorch's): the batch variance that
// normalizes is biased (divided by N * HW), the one folded into the running
// variance is unbiased (divided by N * HW - 1), and
//   running = (1 - momentum) * running + momentum * batch statistic.
#include <cmath>
#include <algorithm>
#include <string>
#include <vector>

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


// Channels last, [N, HW, C]: the sums run per block of channels (a cache
// line of floats), walking the rows in (image, position) order, so each
// channel's sums run in NCHW's order (the same bits) while reading memory
// contiguously; the elementwise pass then splits the rows.
constexpr std::int64_t kChannelBlock = 16;

template <class Body>
void parallel_channel_blocks(const BatchNormGeometry& g, const Body& body) {
  const std::int64_t blocks = (g.c + kChannelBlock - 1) / kChannelBlock;
  detail::parallel_for(blocks, detail::grain_for(2 * g.per_channel() * kChannelBlock),
                       [&](std::int64_t lo, std::int64_t hi) {
                         for (std::int64_t b = lo; b < hi; ++b)
                           body(b * kChannelBlock, std::min(g.c, (b + 1) * kChannelBlock));
                       });
}

// body(offset of the row's channel c0) for every (image, position), in order.
template <class Body>
void for_rows(const BatchNormGeometry& g, std::int64_t c0, const Body& body) {
  const std::int64_t rows = g.n * g.hw;
  for (std::int64_t r = 0; r < rows; ++r) body(r * g.c + c0);
}

// out[r, c] = f(r * C + c, c) for every row, the rows split over the threads.
template <class F>
void parallel_rows(const BatchNormGeometry& g, const F& f) {
  detail::parallel_for(g.n * g.hw, detail::grain_for(g.c), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r)
      for (std::int64_t c = 0; c < g.c; ++c) f(r * g.c + c, c);
  });
}

void forward_train_nhwc(float* y, float* save_mean, float* save_invstd, float* running_mean, float* running_var,
                        const float* x, const float* gamma, const float* beta, const BatchNormGeometry& g, float eps,
                        float momentum) {
  const std::int64_t m = g.per_channel();
  std::vector<float> meanf(static_cast<std::size_t>(g.c)), scale(static_cast<std::size_t>(g.c)),
      shift(static_cast<std::size_t>(g.c));
  parallel_channel_blocks(g, [&](std::int64_t c0, std::int64_t c1) {
    const std::int64_t nb = c1 - c0;
    double s[kChannelBlock] = {}, ss[kChannelBlock] = {}, mean[kChannelBlock];
    for_rows(g, c0, [&](std::int64_t at) {
      for (std::int64_t k = 0; k < nb; ++k) s[k] += x[at + k];
    });
    for (std::int64_t k = 0; k < nb; ++k) mean[k] = s[k] / static_cast<double>(m);
    for_rows(g, c0, [&](std::int64_t at) {
      for (std::int64_t k = 0; k < nb; ++k) {
        const double d = x[at + k] - mean[k];
        ss[k] += d * d;
      }
    });
    for (std::int64_t k = 0; k < nb; ++k) {
      const std::int64_t c = c0 + k;
      const double var = ss[k] / static_cast<double>(m);
      const double invstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
      meanf[c] = static_cast<float>(mean[k]);
      scale[c] = static_cast<float>(gamma[c] * invstd);
      shift[c] = beta[c];
      save_mean[c] = static_cast<float>(mean[k]);
      save_invstd[c] = static_cast<float>(invstd);
      const double mo = momentum;
      running_mean[c] = static_cast<float>((1.0 - mo) * running_mean[c] + mo * mean[k]);
      running_var[c] = static_cast<float>((1.0 - mo) * running_var[c] + mo * ss[k] / static_cast<double>(m - 1));
    }
  });
  parallel_rows(g, [&](std::int64_t i, std::int64_t c) { y[i] = (x[i] - meanf[c]) * scale[c] + shift[c]; });
}

void forward_infer_nhwc(float* y, const float* x, const float* gamma, const float* beta, const float* running_mean,
                        const float* running_var, const BatchNormGeometry& g, float eps) {
  std::vector<float> scale(static_cast<std::size_t>(g.c));
  for (std::int64_t c = 0; c < g.c; ++c)
    scale[c] = static_cast<float>(
        gamma[c] * (1.0 / std::sqrt(static_cast<double>(running_var[c]) + static_cast<double>(eps))));
  parallel_rows(g, [&](std::int64_t i, std::int64_t c) { y[i] = (x[i] - running_mean[c]) * scale[c] + beta[c]; });
}

void backward_nhwc(float* dx, float* dgamma, float* dbeta, const float* x, const float* dy, const float* gamma,
                   const float* save_mean, const float* save_invstd, const BatchNormGeometry& g) {
  const std::int64_t m = g.per_channel();
  std::vector<float> a(static_cast<std::size_t>(g.c)), b(static_cast<std::size_t>(g.c)),
      kk(static_cast<std::size_t>(g.c)), meanf(static_cast<std::size_t>(g.c));
  parallel_channel_blocks(g, [&](std::int64_t c0, std::int64_t c1) {
    const std::int64_t nb = c1 - c0;
    double mean[kChannelBlock], sdy[kChannelBlock] = {}, sdyx[kChannelBlock] = {};
    for (std::int64_t k = 0; k < nb; ++k) mean[k] = save_mean[c0 + k];
    for_rows(g, c0, [&](std::int64_t at) {
      for (std::int64_t k = 0; k < nb; ++k) {
        sdy[k] += dy[at + k];
        sdyx[k] += dy[at + k] * (x[at + k] - mean[k]);
      }
    });
    for (std::int64_t k = 0; k < nb; ++k) {
      const std::int64_t c = c0 + k;
      const double invstd = save_invstd[c];
      dbeta[c] = static_cast<float>(sdy[k]);
      dgamma[c] = static_cast<float>(sdyx[k] * invstd);
      if (m == 0) continue;
      const double inv_m = 1.0 / static_cast<double>(m);
      const double gi = gamma[c] * invstd;
      a[c] = static_cast<float>(gi);
      b[c] = static_cast<float>(-gi * invstd * invstd * sdyx[k] * inv_m);
      kk[c] = static_cast<float>(-gi * sdy[k] * inv_m);
      meanf[c] = static_cast<float>(mean[k]);
    }
  });
  if (m == 0) return;
  parallel_rows(g, [&](std::int64_t i, std::int64_t c) { dx[i] = a[c] * dy[i] + b[c] * (x[i] - meanf[c]) + kk[c]; });
}

}  // namespace

void batch_norm_forward_train(float* y, float* save_mean, float* save_invstd, float* running_mean,
                              float* running_var, const float* x, const float* gamma, const float* beta,
                              const BatchNormGeometry& g, float eps, float momentum) {
  check(g, "batch_norm_forward_train");
  const std::int64_t m = g.per_channel();
  if (m < 2) throw Error("batch_norm_forward_train: training needs at least 2 values per channel, got " + std::to_string(m));
  if (g.nhwc) return forward_train_nhwc(y, save_mean, save_invstd, running_mean, running_var, x, gamma, beta, g, eps,
                                        momentum);
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
  if (g.nhwc) return forward_infer_nhwc(y, x, gamma, beta, running_mean, running_var, g, eps);
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
  if (g.nhwc) return backward_nhwc(dx, dgamma, dbeta, x, dy, gamma, save_mean, save_invstd, g);
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
