// The transformer's ops but attention: GELU, softmax and layer
// normalization over the last dimension, the embedding lookup (docs/design/transformer-ops.md).
// Shape checks at push time, then one engine op calling the CPU or GPU kernel.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "launch.h"
#include "weft/nn_ops.h"

namespace weft::ops {

using detail::describe;
using detail::launch;
using detail::OpIO;
namespace cpu = kernels::cpu;

namespace {

// x's rows along its last dimension: [rows, cols] with cols = the last
// extent (rank >= 1, contiguous memory).
struct Rows {
  std::int64_t rows = 0, cols = 0;
};
Rows rows_of(const char* op, const Tensor& x, const char* what) {
  detail::check_not_channels_last(op, x, what);
  if (x.shape().rank() < 1)
    throw InvalidArgument(std::string(op) + ": " + what + " " + describe(x) +
                          " is a scalar; the op works along the last dimension");
  const std::int64_t cols = x.shape()[x.shape().rank() - 1];
  if (cols == 0)
    throw InvalidArgument(std::string(op) + ": " + what + " " + describe(x) + " has an empty last dimension");
  return {x.numel() / cols, cols};
}

void check_pair(const char* op, const Tensor& a, const char* what_a, const Tensor& b, const char* what_b) {
  detail::check_floating(op, a, what_a);
  detail::check_floating(op, b, what_b);
  detail::check_same_device(op, a, b);
  detail::check_same_dtype(op, a, what_a, b, what_b);
  if (a.shape() != b.shape())
    throw InvalidArgument(std::string(op) + ": " + what_b + " " + describe(b) + " does not match " + what_a + " " +
                          describe(a));
}

// Per-feature (float32, [cols]) or per-row (float32, [rows]) tensors beside x.
void check_vector_beside(const char* op, const Tensor& x, const Tensor& t, const char* what, std::int64_t n,
                         const char* of) {
  detail::check_float32(op, t, what);
  detail::check_same_device(op, x, t);
  if (t.shape() != Shape{n})
    throw InvalidArgument(std::string(op) + ": " + what + " " + describe(t) + " does not match x " + describe(x) +
                          " (want [" + std::to_string(n) + "], one per " + of + ")");
}

}  // namespace

Tensor gelu(const Tensor& x) {
  detail::check_floating("gelu", x, "x");
  Tensor y = detail::make_like(x, x.shape(), x.dtype(), x.memory_format());
  const std::int64_t n = x.numel();
  [[maybe_unused]] const DType t = x.dtype();
  launch("gelu", detail::exec_device(x.device()), {&x}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("gelu", gelu(*ctx.gpu, t, io.out[0], io.in[0], n));
    else
      cpu::gelu(io.o(0), io.i(0), n);
  });
  return y;
}

Tensor gelu_backward(const Tensor& x, const Tensor& dy_in) {
  check_pair("gelu_backward", x, "x", dy_in, "dy");
  const Tensor dy = detail::as_format(dy_in, x.memory_format());
  Tensor dx = detail::make_like(x, x.shape(), x.dtype(), x.memory_format());
  const std::int64_t n = x.numel();
  [[maybe_unused]] const DType t = x.dtype();
  launch("gelu_backward", detail::exec_device(x.device()), {&x, &dy}, {&dx}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("gelu_backward", gelu_grad(*ctx.gpu, t, io.out[0], io.in[0], io.in[1], n));
    else
      cpu::gelu_grad(io.o(0), io.i(0), io.i(1), n);
  });
  return dx;
}

Tensor softmax(const Tensor& x) {
  detail::check_floating("softmax", x, "x");
  const Rows r = rows_of("softmax", x, "x");
  Tensor y = detail::make_like(x, x.shape());
  [[maybe_unused]] const DType t = x.dtype();
  launch("softmax", detail::exec_device(x.device()), {&x}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("softmax", softmax_rows(*ctx.gpu, t, io.out[0], io.in[0], r.rows, r.cols));
    else
      cpu::softmax_rows(io.o(0), io.i(0), r.rows, r.cols);
  });
  return y;
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  check_pair("softmax_backward", y, "y", dy, "dy");
  const Rows r = rows_of("softmax_backward", y, "y");
  detail::check_not_channels_last("softmax_backward", dy, "dy");
  Tensor dx = detail::make_like(y, y.shape());
  [[maybe_unused]] const DType t = y.dtype();
  launch("softmax_backward", detail::exec_device(y.device()), {&y, &dy}, {&dx}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("softmax_backward",
                      softmax_rows_backward(*ctx.gpu, t, io.out[0], io.in[0], io.in[1], r.rows, r.cols));
    else
      cpu::softmax_rows_backward(io.o(0), io.i(0), io.i(1), r.rows, r.cols);
  });
  return dx;
}

LayerNormForward layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, LayerNormParams p) {
  constexpr const char* op = "layer_norm";
  detail::check_floating(op, x, "x");
  const Rows r = rows_of(op, x, "x");
  check_vector_beside(op, x, weight, "weight", r.cols, "feature of the last dimension");
  check_vector_beside(op, x, bias, "bias", r.cols, "feature of the last dimension");
  if (!(p.eps > 0.0f) || !std::isfinite(p.eps))
    throw InvalidArgument(std::string(op) + ": eps must be a positive number, got " + std::to_string(p.eps));
  LayerNormForward out{detail::make_like(x, x.shape()), detail::make_like(x, Shape{r.rows}, DType::float32),
                       detail::make_like(x, Shape{r.rows}, DType::float32)};
  const float eps = p.eps;
  [[maybe_unused]] const DType t = x.dtype();
  launch(op, detail::exec_device(x.device()), {&x, &weight, &bias}, {&out.y, &out.mean, &out.rstd},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL(op, layer_norm_forward(*ctx.gpu, t, io.out[0], io.o(1), io.o(2), io.in[0], io.i(1),
                                                    io.i(2), r.rows, r.cols, eps));
           else
             cpu::layer_norm_forward(io.o(0), io.o(1), io.o(2), io.i(0), io.i(1), io.i(2), r.rows, r.cols, eps);
         });
  return out;
}

LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd) {
  constexpr const char* op = "layer_norm_backward";
  check_pair(op, x, "x", dy, "dy");
  const Rows r = rows_of(op, x, "x");
  detail::check_not_channels_last(op, dy, "dy");
  check_vector_beside(op, x, weight, "weight", r.cols, "feature of the last dimension");
  check_vector_beside(op, x, mean, "mean", r.rows, "row");
  check_vector_beside(op, x, rstd, "rstd", r.rows, "row");
  LayerNormGrads out{detail::make_like(x, x.shape()), detail::make_like(x, Shape{r.cols}, DType::float32),
                     detail::make_like(x, Shape{r.cols}, DType::float32)};
  [[maybe_unused]] const DType t = x.dtype();
  launch(op, detail::exec_device(x.device()), {&x, &dy, &weight, &mean, &rstd},
         {&out.dx, &out.dweight, &out.dbias}, [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL(op, layer_norm_backward(*ctx.gpu, t, io.out[0], io.o(1), io.o(2), io.in[0], io.in[1],
                                                     io.i(2), io.i(3), io.i(4), r.rows, r.cols));
           else
             cpu::layer_norm_backward(io.o(0), io.o(1), io.o(2), io.i(0), io.i(1), io.i(2), io.i(3), io.i(4), r.rows,
                                      r.cols);
         });
  return out;
}

}  // namespace weft::ops

namespace weft::ops {
namespace {

// ids' position `at` (flat) as a multi-index, "[1, 2]".
std::string position(const Shape& s, std::int64_t at) {
  std::vector<std::int64_t> idx(s.rank());
  for (std::size_t d = s.rank(); d-- > 0;) {
    idx[d] = s[d] == 0 ? 0 : at % s[d];
    at = s[d] == 0 ? 0 : at / s[d];
  }
  std::string out = "[";
  for (std::size_t d = 0; d < idx.size(); ++d) out += (d ? ", " : "") + std::to_string(idx[d]);
  return out + "]";
}

[[noreturn]] void bad_id(const char* op, const std::string& ids_shown, const Shape& ids_shape, const float* ids,
                         std::int64_t at, const std::string& table_shown, std::int64_t vocab) {
  std::ostringstream value;
  value << ids[at];
  throw InvalidArgument(std::string(op) + ": ids " + ids_shown + " hold " + value.str() + " at index " +
                        position(ids_shape, at) + ", not a row of the vocabulary (" + table_shown + ": ids in [0, " +
                        std::to_string(vocab) + "))");
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  constexpr const char* op = "embedding";
  detail::check_floating(op, weight, "weight");
  detail::check_rank(op, weight, 2, "weight");
  detail::check_float32(op, ids, "ids");
  detail::check_same_device(op, weight, ids);
  detail::check_not_channels_last(op, ids, "ids");
  const std::int64_t vocab = weight.shape()[0], width = weight.shape()[1], n = ids.numel();
  std::vector<std::int64_t> dims(ids.shape().dims().begin(), ids.shape().dims().end());
  dims.push_back(width);
  Tensor y = detail::make_like(weight, Shape(dims));
  const std::string ids_shown = describe(ids), table_shown = "weight " + describe(weight);
  const Shape ids_shape = ids.shape();
  [[maybe_unused]] const DType t = weight.dtype();
  launch(op, detail::exec_device(weight.device()), {&weight, &ids}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu) {
      WEFT_GPU_KERNEL(op, embedding_forward(*ctx.gpu, t, io.out[0], io.in[0], io.i(1), n, vocab, width));
    } else if (const std::int64_t bad = cpu::embedding_forward(io.o(0), io.i(0), io.i(1), n, vocab, width); bad >= 0) {
      bad_id(op, ids_shown, ids_shape, io.i(1), bad, table_shown, vocab);
    }
  });
  return y;
}

Tensor embedding_backward(const Tensor& ids, const Tensor& dy, std::int64_t vocab) {
  constexpr const char* op = "embedding_backward";
  detail::check_float32(op, ids, "ids");
  detail::check_floating(op, dy, "dy");
  detail::check_same_device(op, dy, ids);
  detail::check_not_channels_last(op, dy, "dy");
  const Shape& s = dy.shape();
  bool match = s.rank() == ids.shape().rank() + 1;
  for (std::size_t d = 0; match && d < ids.shape().rank(); ++d) match = s[d] == ids.shape()[d];
  if (!match)
    throw InvalidArgument(std::string(op) + ": dy " + describe(dy) + " is not ids " + describe(ids) +
                          "'s shape with one more (the width) dimension");
  if (vocab < 1) throw InvalidArgument(std::string(op) + ": vocabulary size " + std::to_string(vocab) + " < 1");
  const std::int64_t width = s[s.rank() - 1], n = ids.numel();
  Tensor dweight = detail::make_like(dy, Shape{vocab, width}, DType::float32);
  const std::string ids_shown = describe(ids), table_shown = "dweight [" + std::to_string(vocab) + ", " +
                                                            std::to_string(width) + "]";
  const Shape ids_shape = ids.shape();
  [[maybe_unused]] const DType t = dy.dtype();
  [[maybe_unused]] const bool deterministic = dy.engine().conv_algo().deterministic;
  launch(op, detail::exec_device(dy.device()), {&ids, &dy}, {&dweight}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu) {
      WEFT_GPU_KERNEL(op, embedding_backward(*ctx.gpu, t, deterministic, io.o(0), io.i(0), io.in[1], n, vocab, width));
    } else if (const std::int64_t bad = cpu::embedding_backward(io.o(0), io.i(0), io.i(1), n, vocab, width);
               bad >= 0) {
      bad_id(op, ids_shown, ids_shape, io.i(0), bad, table_shown, vocab);
    }
  });
  return dweight;
}

}  // namespace weft::ops
