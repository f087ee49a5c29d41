// Shapes of the 2-D convolution and pooling kernels, shared by the CPU and GPU
// implementations and by the op layer that checks them at push time.
#pragma once

#include <cstdint>

namespace weft::kernels {

// NCHW input, OIHW filter, square stride/padding per axis.
struct ConvGeometry {
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // input
  std::int64_t o = 0, kh = 0, kw = 0;       // filter: o output channels, c input channels
  std::int64_t stride = 1, pad = 0;
  std::int64_t out_h() const noexcept { return (h + 2 * pad - kh) / stride + 1; }
  std::int64_t out_w() const noexcept { return (w + 2 * pad - kw) / stride + 1; }
};

// NCHW pooling window (no padding).
struct PoolGeometry {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  std::int64_t kernel = 2, stride = 2;
  std::int64_t out_h() const noexcept { return (h - kernel) / stride + 1; }
  std::int64_t out_w() const noexcept { return (w - kernel) / stride + 1; }
};

}  // namespace weft::kernels
