// Memory-format conversions: NCHW <-> NHWC of elements of any size (the op
// moves bytes, so half tensors convert without widening).
#include <cstring>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"

namespace weft::kernels::cpu {

void to_channels_last(void* y, const void* x, std::int64_t n, std::int64_t c, std::int64_t hw, std::size_t elem) {
  auto* dst = static_cast<unsigned char*>(y);
  const auto* src = static_cast<const unsigned char*>(x);
  detail::parallel_for(n * hw, detail::grain_for(c), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {  // r = image * hw + position
      const std::int64_t i = r / hw, p = r % hw;
      for (std::int64_t k = 0; k < c; ++k)
        std::memcpy(dst + static_cast<std::size_t>(r * c + k) * elem,
                    src + static_cast<std::size_t>((i * c + k) * hw + p) * elem, elem);
    }
  });
}

void to_channels_first(void* y, const void* x, std::int64_t n, std::int64_t c, std::int64_t hw, std::size_t elem) {
  auto* dst = static_cast<unsigned char*>(y);
  const auto* src = static_cast<const unsigned char*>(x);
  detail::parallel_for(n * c, detail::grain_for(hw), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t q = lo; q < hi; ++q) {  // q = image * c + channel
      const std::int64_t i = q / c, k = q % c;
      for (std::int64_t p = 0; p < hw; ++p)
        std::memcpy(dst + static_cast<std::size_t>(q * hw + p) * elem,
                    src + static_cast<std::size_t>((i * hw + p) * c + k) * elem, elem);
    }
  });
}

}  // namespace weft::kernels::cpu
