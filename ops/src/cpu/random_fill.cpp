// Random creation kernels. Each element comes from its own (seed, index)
// counter, so the values do not depend on how the range is split across
// threads, nor on the device (the GPU kernels use the same ../random.h).
#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"
#include "random.h"

namespace weft::kernels::cpu {

void uniform(float* y, std::int64_t n, float lo, float hi, std::uint64_t seed) {
  const float span = hi - lo;
  detail::parallel_for(n, detail::grain_for(8), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) y[i] = lo + span * uniform01(seed, static_cast<std::uint64_t>(i));
  });
}

void normal(float* y, std::int64_t n, float mean, float stddev, std::uint64_t seed) {
  // logf + cosf + sqrtf: a few dozen cheap operations per element.
  detail::parallel_for(n, detail::grain_for(40), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) y[i] = mean + stddev * standard_normal(seed, static_cast<std::uint64_t>(i));
  });
}

}  // namespace weft::kernels::cpu
