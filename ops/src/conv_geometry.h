// Shapes of the 2-D convolution and pooling kernels, shared by the CPU and GPU
// implementations and by the op layer that checks them at push time.
#pragma once

#include <cstdint>

#include "weft/dtype.h"
#include "weft/engine.h"

namespace weft::kernels {

// How a GPU convolution picks its algorithm (weft::ConvAlgo, weft/engine.h:
// fields benchmark and deterministic).
using ConvAlgoChoice = weft::ConvAlgo;

// NCHW input, OIHW filter, square stride/padding per axis; the data's dtype
// (x, w, y, b and their gradients), whether float32 may run as TF32, and the
// algorithm choice. With `nhwc`, x, y, dx, dy are stored NHWC and w, dw OHWI
// (channels last; the sizes keep their NCHW meaning).
struct ConvGeometry {
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // input
  std::int64_t o = 0, kh = 0, kw = 0;       // filter: o output channels, c input channels
  std::int64_t stride = 1, pad = 0;
  DType dtype = DType::float32;
  bool tf32 = false;
  ConvAlgoChoice algo{};
  bool nhwc = false;
  std::int64_t out_h() const noexcept { return (h + 2 * pad - kh) / stride + 1; }
  std::int64_t out_w() const noexcept { return (w + 2 * pad - kw) / stride + 1; }
};

// NCHW pooling window with implicit padding on every side: padded positions
// never win a max and count as zeros in an average (PyTorch's
// count_include_pad). pad <= kernel / 2, so every window holds input.
// With `nhwc`, x, y and their gradients are stored NHWC.
struct PoolGeometry {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  std::int64_t kernel = 2, stride = 2, pad = 0;
  bool nhwc = false;
  std::int64_t out_h() const noexcept { return (h + 2 * pad - kernel) / stride + 1; }
  std::int64_t out_w() const noexcept { return (w + 2 * pad - kernel) / stride + 1; }
};

// Batch normalization over [N, C, HW] (HW = 1 for [N, C] inputs): statistics
// per channel over the N * HW values of that channel. With `nhwc`, x, y and
// their gradients are stored [N, HW, C] (channels last).
struct BatchNormGeometry {
  std::int64_t n = 0, c = 0, hw = 1;
  bool nhwc = false;
  // Where value j of channel c of image i lies: base(i, c) + j * step().
  std::int64_t base(std::int64_t i, std::int64_t ch) const noexcept { return nhwc ? i * hw * c + ch : (i * c + ch) * hw; }
  std::int64_t step() const noexcept { return nhwc ? c : 1; }
  std::int64_t per_channel() const noexcept { return n * hw; }
};

}  // namespace weft::kernels
