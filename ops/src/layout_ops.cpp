// Memory-format conversion: one op moving the bytes of x into the other
// layout (docs/design/tensors.md, "Memory formats").
#include <string>

#include "cpu/cpu_kernels.h"
#include "launch.h"
#include "weft/ops.h"

namespace weft {

namespace ops {

Tensor to_memory_format(const Tensor& x, MemoryFormat format) {
  detail::check_floating("to_memory_format", x, "x");
  if (x.memory_format() == format) return x;
  const bool to_last = format == MemoryFormat::channels_last;
  const char* op = to_last ? "to_channels_last" : "to_contiguous";
  if (to_last && x.shape().rank() != 4)
    throw InvalidArgument(std::string(op) + ": x " + detail::describe(x) +
                          " is not 4-D; only [N, C, H, W] tensors can be channels_last");
  const Shape& s = x.shape();
  const std::int64_t n = s[0], c = s[1], hw = s[2] * s[3];
  const DType t = x.dtype();
  Tensor y = detail::make_like(x, s, t, format);
  detail::launch(op, detail::exec_device(x.device()), {&x}, {&y}, [=](RunContext& ctx, detail::OpIO& io) {
    if (n * c * hw == 0) return;
    const std::size_t elem = dtype_size(t);
    if (ctx.gpu) {
      if (to_last)
        WEFT_GPU_KERNEL("to_channels_last", to_channels_last(*ctx.gpu, io.out[0], io.in[0], n, c, hw, elem));
      else
        WEFT_GPU_KERNEL("to_contiguous", to_channels_first(*ctx.gpu, io.out[0], io.in[0], n, c, hw, elem));
    } else if (to_last) {
      kernels::cpu::to_channels_last(io.out[0], io.in[0], n, c, hw, elem);
    } else {
      kernels::cpu::to_channels_first(io.out[0], io.in[0], n, c, hw, elem);
    }
  }, OpProperty::normal, 0, detail::Body::bytes);
  return y;
}

}  // namespace ops

namespace detail {

Tensor as_format(const Tensor& x, MemoryFormat format) {
  return x.memory_format() == format ? x : ops::to_memory_format(x, format);
}

void check_not_channels_last(const char* op, const Tensor& t, const char* what) {
  if (t.defined() && t.memory_format() == MemoryFormat::channels_last)
    throw InvalidArgument(std::string(op) + ": " + what + " " + describe(t) +
                          " is channels_last, which this op cannot take (ops::contiguous converts it)");
}

}  // namespace detail

}  // namespace weft
