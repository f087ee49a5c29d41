// Softmax cross-entropy, the classification loss.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"
#include "weft/error.h"

namespace weft::kernels::cpu {

void softmax_cross_entropy(float* loss, float* dlogits, const float* logits, const float* labels, std::int64_t rows,
                           std::int64_t cols) {
  // Labels are checked up front, in row order, so a bad batch reports its
  // first bad row every time and leaves the outputs untouched.
  for (std::int64_t r = 0; r < rows; ++r) {
    const float l = labels[r];
    if (!(l >= 0.0f) || !(static_cast<double>(l) < static_cast<double>(cols)) || std::floor(l) != l) {
      std::ostringstream msg;
      msg << "softmax_cross_entropy: row " << r << " has label " << l << ", not a class index in [0, " << cols << ")";
      throw Error(msg.str());
    }
  }
  if (rows <= 0) {
    *loss = 0.0f;
    return;
  }
  // Each row is shifted by its max before exp, so large logits cannot
  // overflow; the row terms are summed in row order, in double.
  std::vector<double> row_loss(static_cast<std::size_t>(rows));
  const double inv_rows = 1.0 / static_cast<double>(rows);
  detail::parallel_for(rows, detail::grain_for(cols * 8), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const float* z = logits + r * cols;
      const auto label = static_cast<std::int64_t>(labels[r]);
      float zmax = z[0];
      for (std::int64_t j = 1; j < cols; ++j) zmax = std::max(zmax, z[j]);
      double denom = 0.0;
      for (std::int64_t j = 0; j < cols; ++j) denom += std::exp(static_cast<double>(z[j]) - zmax);
      const double log_denom = std::log(denom);
      row_loss[static_cast<std::size_t>(r)] = log_denom - (static_cast<double>(z[label]) - zmax);
      if (dlogits) {
        float* g = dlogits + r * cols;
        for (std::int64_t j = 0; j < cols; ++j) {
          const double p = std::exp(static_cast<double>(z[j]) - zmax - log_denom);
          g[j] = static_cast<float>(((j == label ? p - 1.0 : p)) * inv_rows);
        }
      }
    }
  });
  double total = 0.0;
  for (double v : row_loss) total += v;
  *loss = static_cast<float>(total * inv_rows);
}

}  // namespace weft::kernels::cpu
