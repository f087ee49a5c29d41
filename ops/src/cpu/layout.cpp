// Memory-format conversions (NCHW <-> NHWC) and axis permutations, of
// elements of any size (the ops move bytes, so any dtype moves unwidened).
#include <cstring>
#include <cstddef>

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

namespace {

// One output row of `n` elements of E, read `stride` elements apart.
template <std::size_t E>
void strided_row(unsigned char* dst, const unsigned char* src, std::int64_t n, std::int64_t stride) {
  for (std::int64_t j = 0; j < n; ++j) std::memcpy(dst + static_cast<std::size_t>(j) * E, src + static_cast<std::size_t>(j * stride) * E, E);
}

}  // namespace

void permute(void* y, const void* x, int rank, const std::int64_t* extent, const std::int64_t* src_stride,
             std::size_t elem) {
  auto* dst = static_cast<unsigned char*>(y);
  const auto* src = static_cast<const unsigned char*>(x);
  const int outer_axes = rank - 1;
  const std::int64_t inner = extent[rank - 1], inner_stride = src_stride[rank - 1];
  std::int64_t rows = 1;
  for (int a = 0; a < outer_axes; ++a) rows *= extent[a];
  if (rows == 0 || inner == 0) return;
  const std::size_t row_bytes = static_cast<std::size_t>(inner) * elem;
  detail::parallel_for(rows, detail::grain_for(inner), [&](std::int64_t lo, std::int64_t hi) {
    // The piece's first row as an index over the outer axes, and its source
    // offset; both advance row by row as an odometer.
    std::int64_t idx[6] = {0, 0, 0, 0, 0, 0};
    std::int64_t off = 0;
    for (std::int64_t r = lo, a = outer_axes - 1; a >= 0; --a) {
      idx[a] = r % extent[a];
      r /= extent[a];
      off += idx[a] * src_stride[a];
    }
    for (std::int64_t r = lo; r < hi; ++r) {
      unsigned char* out = dst + static_cast<std::size_t>(r) * row_bytes;
      const unsigned char* in = src + static_cast<std::size_t>(off) * elem;
      if (inner_stride == 1) {
        std::memcpy(out, in, row_bytes);  // the last axis stays last: one run
      } else {
        switch (elem) {
          case 1: strided_row<1>(out, in, inner, inner_stride); break;
          case 2: strided_row<2>(out, in, inner, inner_stride); break;
          case 4: strided_row<4>(out, in, inner, inner_stride); break;
          case 8: strided_row<8>(out, in, inner, inner_stride); break;
          default:
            for (std::int64_t j = 0; j < inner; ++j)
              std::memcpy(out + static_cast<std::size_t>(j) * elem, in + static_cast<std::size_t>(j * inner_stride) * elem, elem);
        }
      }
      for (int a = outer_axes - 1; a >= 0; --a) {  // next row
        off += src_stride[a];
        if (++idx[a] < extent[a]) break;
        off -= idx[a] * src_stride[a];
        idx[a] = 0;
      }
    }
  });
}

}  // namespace weft::kernels::cpu
