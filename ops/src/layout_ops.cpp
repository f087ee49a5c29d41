// Memory-format conversion and axis permutation: one op each, moving the
// bytes of x into another layout (docs/design/tensors.md, "Memory formats"
// and "Permuting axes").
#include <array>
#include <string>
#include <vector>

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

namespace {

std::string dims_str(const std::vector<int>& dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

}  // namespace

Tensor permute(const Tensor& x, std::vector<int> dims) {
  detail::check_defined("permute", x, "x");
  const Shape& s = x.shape();
  const int rank = static_cast<int>(s.rank());
  const auto fail = [&](const std::string& why) {
    throw InvalidArgument("permute: x " + detail::describe(x) + " with dims " + dims_str(dims) + ": " + why);
  };
  if (rank < 1 || rank > 6) fail("rank " + std::to_string(rank) + " is outside 1..6");
  if (static_cast<int>(dims.size()) != rank)
    fail(std::to_string(dims.size()) + " dims for a rank-" + std::to_string(rank) + " tensor (one per axis)");
  std::vector<bool> seen(static_cast<std::size_t>(rank), false);
  for (int d : dims) {
    if (d < 0 || d >= rank) fail("axis " + std::to_string(d) + " is outside [0, " + std::to_string(rank) + ")");
    if (seen[static_cast<std::size_t>(d)]) fail("axis " + std::to_string(d) + " appears twice");
    seen[static_cast<std::size_t>(d)] = true;
  }
  if (x.memory_format() == MemoryFormat::channels_last)
    fail("x is channels_last; permute reads contiguous tensors (ops::contiguous converts it)");

  std::vector<std::int64_t> out_dims(static_cast<std::size_t>(rank));
  for (int a = 0; a < rank; ++a) out_dims[static_cast<std::size_t>(a)] = s[static_cast<std::size_t>(dims[static_cast<std::size_t>(a)])];
  Tensor y = detail::make_like(x, Shape(out_dims));
  // The kernels' geometry: each output axis's extent and stride in x, with
  // axes of extent 1 dropped and neighbours that x also holds in order
  // merged (the identity becomes one run, [B, T, 3, H, D] -> {2, 0, 3, 1, 4}
  // keeps runs of D), so the last axis is as long as it can be.
  std::vector<std::int64_t> x_stride(static_cast<std::size_t>(rank), 1);
  for (int a = rank - 2; a >= 0; --a)
    x_stride[static_cast<std::size_t>(a)] = x_stride[static_cast<std::size_t>(a + 1)] * s[static_cast<std::size_t>(a + 1)];
  std::array<std::int64_t, 6> extent{}, stride{};
  int n = 0;
  for (int a = 0; a < rank; ++a) {
    const std::size_t d = static_cast<std::size_t>(dims[static_cast<std::size_t>(a)]);
    if (s[d] == 1) continue;
    if (n > 0 && stride[static_cast<std::size_t>(n - 1)] == x_stride[d] * s[d]) {
      extent[static_cast<std::size_t>(n - 1)] *= s[d];
      stride[static_cast<std::size_t>(n - 1)] = x_stride[d];
      continue;
    }
    extent[static_cast<std::size_t>(n)] = s[d];
    stride[static_cast<std::size_t>(n)] = x_stride[d];
    ++n;
  }
  if (n == 0) extent[0] = 1, stride[0] = 1, n = 1;  // one element
  const std::int64_t numel = x.numel();
  const std::size_t elem = dtype_size(x.dtype());
  // Bytes, any dtype (Body::bytes: nothing widened); the simulator's cost
  // model charges x read and y written once (OpCost's default).
  detail::launch("permute", detail::exec_device(x.device()), {&x}, {&y}, [=](RunContext& ctx, detail::OpIO& io) {
    if (numel == 0) return;
    if (ctx.gpu)
      WEFT_GPU_KERNEL("permute", permute(*ctx.gpu, io.out[0], io.in[0], n, extent.data(), stride.data(), elem));
    else
      kernels::cpu::permute(io.out[0], io.in[0], n, extent.data(), stride.data(), elem);
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
