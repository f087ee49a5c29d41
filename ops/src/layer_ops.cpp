// Layer ops (dense, convolution, pooling, batch normalization, loss, causal attention, SGD):
// shape checks at push time, then one engine op calling the CPU or GPU kernel.
#include <algorithm>
#include <cmath>

#include "cpu/cpu_kernels.h"
#include "launch.h"
#include "weft/nn_ops.h"
#include "weft/ops.h"

namespace weft::ops {

using detail::launch;
using detail::OpIO;
namespace cpu = kernels::cpu;

namespace {

using detail::describe;

// A tensor argument, or a bare shape (the backward ops get the forward's
// input or filter shape), with how messages show it.
struct Operand {
  const Shape& shape;
  std::string shown;
  Operand(const Tensor& t) : shape(t.shape()), shown(describe(t)) {}  // NOLINT: implicit by design
  Operand(const Shape& s) : shape(s), shown(s.str()) {}                // NOLINT
};

// The op's data tensors: defined (but a bias), of one floating dtype and on
// one device.
void check_all(const char* op, std::initializer_list<std::pair<const Tensor*, const char*>> tensors) {
  const Tensor* first = nullptr;
  const char* first_what = nullptr;
  for (auto [t, what] : tensors) {
    if (!t->defined() && std::string_view(what) == "b") continue;  // only a bias may be undefined
    detail::check_floating(op, *t, what);
    if (first) {
      detail::check_same_device(op, *first, *t);
      detail::check_same_dtype(op, *first, first_what, *t, what);
    } else {
      first = t;
      first_what = what;
    }
  }
}

// Batch normalization's per-channel tensors (and the loss's labels): float32
// whatever x's dtype, on x's device.
void check_float32_beside(const char* op, const Tensor& x,
                          std::initializer_list<std::pair<const Tensor*, const char*>> tensors) {
  for (auto [t, what] : tensors) {
    detail::check_float32(op, *t, what);
    detail::check_same_device(op, x, *t);
  }
}

// GEMMs and convolutions of float32 data under ops::AllowTf32.
bool tf32_for(const Tensor& t) { return t.dtype() == DType::float32 && AllowTf32::active(); }

kernels::ConvGeometry with_math(kernels::ConvGeometry g, const Tensor& data) {
  g.dtype = data.dtype();
  g.tf32 = tf32_for(data);
  g.algo = data.engine().conv_algo();
  g.nhwc = data.memory_format() == MemoryFormat::channels_last;
  return g;
}

bool channels_last(const Tensor& t) { return t.memory_format() == MemoryFormat::channels_last; }

// A convolution's multiply-adds, counted twice (forward, and each backward pass alike).
double conv_flops(const kernels::ConvGeometry& g) {
  return 2.0 * static_cast<double>(g.n) * static_cast<double>(g.o) * static_cast<double>(g.out_h()) *
         static_cast<double>(g.out_w()) * static_cast<double>(g.c) * static_cast<double>(g.kh) *
         static_cast<double>(g.kw);
}

// A convolution pass's independent outputs (the fill of the simulator's cost
// model): the output (0), the input's gradient (1), the filter's gradient
// (2), whose reduction over the batch is split per image.
double conv_outputs(const kernels::ConvGeometry& g, int pass) {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  switch (pass) {
    case 0: return d(g.n) * d(g.o) * d(g.out_h()) * d(g.out_w());
    case 1: return d(g.n) * d(g.c) * d(g.h) * d(g.w);
    default: return d(g.o) * d(g.c) * d(g.kh) * d(g.kw) * d(g.n);
  }
}

kernels::ConvGeometry conv_geometry(const char* op, const Operand& input, const Operand& filter, Conv2dParams p) {
  const Shape &x = input.shape, &w = filter.shape;
  if (x.rank() != 4 || w.rank() != 4)
    throw Error(std::string(op) + ": input must be [N, C, H, W] and filter [O, C, KH, KW]; got " + input.shown +
                " and " + filter.shown);
  if (x[1] != w[1])
    throw Error(std::string(op) + ": input " + input.shown + " has " + std::to_string(x[1]) + " channels, filter " +
                filter.shown + " expects " + std::to_string(w[1]));
  if (p.stride < 1 || p.pad < 0)
    throw Error(std::string(op) + ": stride " + std::to_string(p.stride) + " / pad " + std::to_string(p.pad) +
                " invalid");
  kernels::ConvGeometry g{x[0], x[1], x[2], x[3], w[0], w[2], w[3], p.stride, p.pad};
  if (g.h + 2 * g.pad < g.kh || g.w + 2 * g.pad < g.kw || g.kh < 1 || g.kw < 1)
    throw Error(std::string(op) + ": filter " + filter.shown + " does not fit input " + input.shown + " with pad " +
                std::to_string(p.pad));
  return g;
}

kernels::PoolGeometry pool_geometry(const char* op, const Operand& input, Pool2dParams p, MemoryFormat format) {
  const Shape& x = input.shape;
  if (x.rank() != 4) throw Error(std::string(op) + ": input must be [N, C, H, W], got " + input.shown);
  if (p.kernel < 1 || p.stride < 1 || p.pad < 0 || 2 * p.pad > p.kernel)
    throw Error(std::string(op) + ": window " + std::to_string(p.kernel) + " stride " + std::to_string(p.stride) +
                " pad " + std::to_string(p.pad) + " is invalid (kernel, stride >= 1; 0 <= pad <= kernel / 2)");
  if (p.kernel > x[2] + 2 * p.pad || p.kernel > x[3] + 2 * p.pad)
    throw Error(std::string(op) + ": window " + std::to_string(p.kernel) + " stride " + std::to_string(p.stride) +
                " pad " + std::to_string(p.pad) + " does not fit input " + input.shown);
  return kernels::PoolGeometry{x[0], x[1], x[2], x[3], p.kernel, p.stride, p.pad,
                               format == MemoryFormat::channels_last};
}

kernels::BatchNormGeometry batch_norm_geometry(const char* op, const Tensor& x,
                                               std::initializer_list<std::pair<const Tensor*, const char*>> per_channel,
                                               BatchNormParams p) {
  const Shape& s = x.shape();
  if (s.rank() != 2 && s.rank() != 4)
    throw Error(std::string(op) + ": x must be [N, C, H, W] or [N, C], got " + describe(x));
  const std::int64_t c = s[1];
  for (auto [t, what] : per_channel)
    if (t->shape() != Shape{c})
      throw Error(std::string(op) + ": " + what + " " + describe(*t) + " does not match x's " + std::to_string(c) +
                  " channels (want [" + std::to_string(c) + "])");
  if (!(p.eps > 0.0f) || !std::isfinite(p.eps))
    throw Error(std::string(op) + ": eps must be a positive number, got " + std::to_string(p.eps));
  if (!(p.momentum >= 0.0f && p.momentum <= 1.0f))
    throw Error(std::string(op) + ": momentum must be in [0, 1], got " + std::to_string(p.momentum));
  return kernels::BatchNormGeometry{s[0], c, s.rank() == 4 ? s[2] * s[3] : 1,
                                    x.memory_format() == MemoryFormat::channels_last};
}

}  // namespace

Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_all("dense", {{&x, "x"}, {&w, "w"}, {&b, "b"}});
  detail::check_rank("dense", x, 2, "x");
  detail::check_rank("dense", w, 2, "w");
  const std::int64_t batch = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
  if (w.shape()[1] != in || (b.defined() && b.shape() != Shape{out}))
    throw Error("dense: x " + describe(x) + ", w " + describe(w) + ", b " + describe(b) + " do not fit (want w [out, " +
                std::to_string(in) + "], b [out])");
  Tensor y = detail::make_like(x, Shape{batch, out});
  const bool has_b = b.defined();
  [[maybe_unused]] const DType t = x.dtype();
  const bool tf32 = tf32_for(x);
  launch("dense", detail::exec_device(x.device()), {&x, &w, &b}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("dense", dense_forward(*ctx.gpu, t, tf32, io.out[0], io.in[0], io.in[1],
                                             has_b ? io.in[2] : nullptr, batch, in, out));
    else
      cpu::dense_forward(io.o(0), io.i(0), io.i(1), has_b ? io.i(2) : nullptr, batch, in, out);
  }, OpProperty::normal, 0, detail::Body::kernels, tf32,
         detail::OpCost{2.0 * static_cast<double>(batch) * static_cast<double>(in) * static_cast<double>(out), 0,
                        static_cast<double>(batch) * static_cast<double>(out)});
  return y;
}

DenseGrads dense_backward(const Tensor& x, const Tensor& w, const Tensor& dy) {
  check_all("dense_backward", {{&x, "x"}, {&w, "w"}, {&dy, "dy"}});
  detail::check_rank("dense_backward", x, 2, "x");
  detail::check_rank("dense_backward", w, 2, "w");
  const std::int64_t batch = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
  if (w.shape()[1] != in || dy.shape() != Shape{batch, out})
    throw Error("dense_backward: x " + describe(x) + ", w " + describe(w) + ", dy " + describe(dy) + " do not fit");
  DenseGrads g{detail::make_like(x, x.shape()), detail::make_like(w, w.shape()), detail::make_like(w, Shape{out})};
  [[maybe_unused]] const DType t = x.dtype();
  const bool tf32 = tf32_for(x);
  launch("dense_backward", detail::exec_device(x.device()), {&x, &w, &dy}, {&g.dx, &g.dw, &g.db},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL("dense_backward", dense_backward(*ctx.gpu, t, tf32, io.out[0], io.out[1], io.out[2],
                                                              io.in[0], io.in[1], io.in[2], batch, in, out));
           else
             cpu::dense_backward(io.o(0), io.o(1), io.o(2), io.i(0), io.i(1), io.i(2), batch, in, out);
         }, OpProperty::normal, 0, detail::Body::kernels, tf32,
         detail::OpCost{4.0 * static_cast<double>(batch) * static_cast<double>(in) * static_cast<double>(out), 0,
                        static_cast<double>(batch) * static_cast<double>(in) + static_cast<double>(in) * static_cast<double>(out)});
  return g;
}

Tensor dense_backward_data(const Tensor& dy, const Tensor& w) {
  check_all("dense_backward_data", {{&dy, "dy"}, {&w, "w"}});
  detail::check_rank("dense_backward_data", dy, 2, "dy");
  detail::check_rank("dense_backward_data", w, 2, "w");
  const std::int64_t batch = dy.shape()[0], out = dy.shape()[1], in = w.shape()[1];
  if (w.shape()[0] != out)
    throw Error("dense_backward_data: dy " + describe(dy) + " and w " + describe(w) + " do not fit (want w [" +
                std::to_string(out) + ", in])");
  Tensor dx = detail::make_like(dy, Shape{batch, in});
  [[maybe_unused]] const DType t = dy.dtype();
  const bool tf32 = tf32_for(dy);
  launch("dense_backward_data", detail::exec_device(dy.device()), {&dy, &w}, {&dx}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("dense_backward_data", dense_backward(*ctx.gpu, t, tf32, io.out[0], nullptr, nullptr, nullptr,
                                                            io.in[1], io.in[0], batch, in, out));
    else
      cpu::dense_backward(io.o(0), nullptr, nullptr, nullptr, io.i(1), io.i(0), batch, in, out);
  }, OpProperty::normal, 0, detail::Body::kernels, tf32,
         detail::OpCost{2.0 * static_cast<double>(batch) * static_cast<double>(in) * static_cast<double>(out), 0,
                        static_cast<double>(batch) * static_cast<double>(in)});
  return dx;
}

DenseWeightGrads dense_backward_weight(const Tensor& x, const Tensor& dy) {
  check_all("dense_backward_weight", {{&x, "x"}, {&dy, "dy"}});
  detail::check_rank("dense_backward_weight", x, 2, "x");
  detail::check_rank("dense_backward_weight", dy, 2, "dy");
  const std::int64_t batch = x.shape()[0], in = x.shape()[1], out = dy.shape()[1];
  if (dy.shape()[0] != batch)
    throw Error("dense_backward_weight: x " + describe(x) + " and dy " + describe(dy) +
                " have different batch sizes");
  DenseWeightGrads g{detail::make_like(x, Shape{out, in}), detail::make_like(x, Shape{out})};
  [[maybe_unused]] const DType t = x.dtype();
  const bool tf32 = tf32_for(x);
  launch("dense_backward_weight", detail::exec_device(x.device()), {&x, &dy}, {&g.dw, &g.db},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL("dense_backward_weight", dense_backward(*ctx.gpu, t, tf32, nullptr, io.out[0], io.out[1],
                                                                     io.in[0], nullptr, io.in[1], batch, in, out));
           else
             cpu::dense_backward(nullptr, io.o(0), io.o(1), io.i(0), nullptr, io.i(1), batch, in, out);
         }, OpProperty::normal, 0, detail::Body::kernels, tf32,
         detail::OpCost{2.0 * static_cast<double>(batch) * static_cast<double>(in) * static_cast<double>(out), 0,
                        static_cast<double>(in) * static_cast<double>(out)});
  return g;
}

Tensor conv2d(const Tensor& x, const Tensor& w_in, const Tensor& b, Conv2dParams p) {
  check_all("conv2d", {{&x, "x"}, {&w_in, "w"}, {&b, "b"}});
  const kernels::ConvGeometry g = with_math(conv_geometry("conv2d", x, w_in, p), x);
  if (b.defined() && b.shape() != Shape{g.o})
    throw Error("conv2d: bias " + describe(b) + " does not match " + std::to_string(g.o) + " output channels");
  const Tensor w = detail::as_format(w_in, x.memory_format());  // the filter in the data's layout
  Tensor y = detail::make_like(x, Shape{g.n, g.o, g.out_h(), g.out_w()}, x.dtype(), x.memory_format());
  const bool has_b = b.defined();
  launch("conv2d", detail::exec_device(x.device()), {&x, &w, &b}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("conv2d", conv2d_forward(*ctx.gpu, io.out[0], io.in[0], io.in[1], has_b ? io.in[2] : nullptr, g));
    else
      cpu::conv2d_forward(io.o(0), io.i(0), io.i(1), has_b ? io.i(2) : nullptr, g);
  }, OpProperty::normal, 0, detail::Body::kernels, g.tf32,
         detail::OpCost{conv_flops(g), 0,
                        conv_outputs(g, 0)});
  return y;
}

Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w_in, const Shape& x_shape, Conv2dParams p) {
  check_all("conv2d_backward_data", {{&dy, "dy"}, {&w_in, "w"}});
  const kernels::ConvGeometry g = with_math(conv_geometry("conv2d_backward_data", x_shape, w_in, p), dy);
  if (dy.shape() != Shape{g.n, g.o, g.out_h(), g.out_w()})
    throw Error("conv2d_backward_data: dy " + describe(dy) + " does not match the output of input " + x_shape.str() +
                " and filter " + describe(w_in));
  const Tensor w = detail::as_format(w_in, dy.memory_format());
  Tensor dx = detail::make_like(dy, x_shape, dy.dtype(), dy.memory_format());
  launch("conv2d_backward_data", detail::exec_device(dy.device()), {&dy, &w}, {&dx}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("conv2d_backward_data", conv2d_backward_data(*ctx.gpu, io.out[0], io.in[0], io.in[1], g));
    else
      cpu::conv2d_backward_data(io.o(0), io.i(0), io.i(1), g);
  }, OpProperty::normal, 0, detail::Body::kernels, g.tf32,
         detail::OpCost{conv_flops(g), 0,
                        conv_outputs(g, 1)});
  return dx;
}

ConvFilterGrads conv2d_backward_filter(const Tensor& x, const Tensor& dy_in, const Shape& w_shape, Conv2dParams p,
                                       MemoryFormat w_format) {
  check_all("conv2d_backward_filter", {{&x, "x"}, {&dy_in, "dy"}});
  const kernels::ConvGeometry g = with_math(conv_geometry("conv2d_backward_filter", x, w_shape, p), x);
  if (dy_in.shape() != Shape{g.n, g.o, g.out_h(), g.out_w()})
    throw Error("conv2d_backward_filter: dy " + describe(dy_in) + " does not match the output of input " +
                describe(x) + " and filter " + w_shape.str());
  const Tensor dy = detail::as_format(dy_in, x.memory_format());
  // The kernel writes dw in the data's layout; a filter of the other format gets it converted after.
  ConvFilterGrads out{detail::make_like(x, w_shape, x.dtype(), x.memory_format()), detail::make_like(x, Shape{g.o})};
  launch("conv2d_backward_filter", detail::exec_device(x.device()), {&x, &dy}, {&out.dw, &out.db},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL("conv2d_backward_filter",
                             conv2d_backward_filter(*ctx.gpu, io.out[0], io.out[1], io.in[0], io.in[1], g));
           else
             cpu::conv2d_backward_filter(io.o(0), io.o(1), io.i(0), io.i(1), g);
         }, OpProperty::normal, 0, detail::Body::kernels, g.tf32,
         detail::OpCost{conv_flops(g), 0,
                        conv_outputs(g, 2)});
  out.dw = detail::as_format(out.dw, w_format);
  return out;
}

#define WEFT_POOL_FORWARD(name, kernel)                                                                      \
  Tensor name(const Tensor& x, Pool2dParams p) {                                                             \
    check_all(#name, {{&x, "x"}});                                                                           \
    const kernels::PoolGeometry g = pool_geometry(#name, x, p, x.memory_format());                           \
    Tensor y = detail::make_like(x, Shape{g.n, g.c, g.out_h(), g.out_w()}, x.dtype(), x.memory_format());    \
    [[maybe_unused]] const DType t = x.dtype();                                                                               \
    launch(#name, detail::exec_device(x.device()), {&x}, {&y}, [=](RunContext& ctx, OpIO& io) {              \
      if (ctx.gpu)                                                                                           \
        WEFT_GPU_KERNEL(#name, kernel(*ctx.gpu, t, io.out[0], io.in[0], g));                                 \
      else                                                                                                   \
        cpu::kernel(io.o(0), io.i(0), g);                                                                    \
    });                                                                                                      \
    return y;                                                                                                \
  }
WEFT_POOL_FORWARD(avg_pool2d, avg_pool2d_forward)
WEFT_POOL_FORWARD(max_pool2d, max_pool2d_forward)
#undef WEFT_POOL_FORWARD

Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x_shape, Pool2dParams p) {
  check_all("avg_pool2d_backward", {{&dy, "dy"}});
  const kernels::PoolGeometry g = pool_geometry("avg_pool2d_backward", x_shape, p, dy.memory_format());
  if (dy.shape() != Shape{g.n, g.c, g.out_h(), g.out_w()})
    throw Error("avg_pool2d_backward: dy " + describe(dy) + " does not match input " + x_shape.str());
  Tensor dx = detail::make_like(dy, x_shape, dy.dtype(), dy.memory_format());
  [[maybe_unused]] const DType t = dy.dtype();
  launch("avg_pool2d_backward", detail::exec_device(dy.device()), {&dy}, {&dx}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("avg_pool2d_backward", avg_pool2d_backward(*ctx.gpu, t, io.out[0], io.in[0], g));
    else
      cpu::avg_pool2d_backward(io.o(0), io.i(0), g);
  });
  return dx;
}

Tensor max_pool2d_backward(const Tensor& x, const Tensor& dy_in, Pool2dParams p) {
  check_all("max_pool2d_backward", {{&x, "x"}, {&dy_in, "dy"}});
  const kernels::PoolGeometry g = pool_geometry("max_pool2d_backward", x, p, x.memory_format());
  if (dy_in.shape() != Shape{g.n, g.c, g.out_h(), g.out_w()})
    throw Error("max_pool2d_backward: dy " + describe(dy_in) + " does not match input " + describe(x));
  const Tensor dy = detail::as_format(dy_in, x.memory_format());
  Tensor dx = detail::make_like(x, x.shape(), x.dtype(), x.memory_format());
  [[maybe_unused]] const DType t = x.dtype();
  launch("max_pool2d_backward", detail::exec_device(x.device()), {&x, &dy}, {&dx}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("max_pool2d_backward", max_pool2d_backward(*ctx.gpu, t, io.out[0], io.in[0], io.in[1], g));
    else
      cpu::max_pool2d_backward(io.o(0), io.i(0), io.i(1), g);
  });
  return dx;
}

Tensor global_avg_pool2d(const Tensor& x) {
  check_all("global_avg_pool2d", {{&x, "x"}});
  detail::check_rank("global_avg_pool2d", x, 4, "x");
  const Shape& s = x.shape();
  const std::int64_t planes = s[0] * s[1], hw = s[2] * s[3], n = s[0], c = s[1];
  const bool nhwc = channels_last(x);
  // [N, C, 1, 1] lies alike in both formats; y keeps x's.
  Tensor y = detail::make_like(x, Shape{s[0], s[1], 1, 1}, x.dtype(), x.memory_format());
  [[maybe_unused]] const DType t = x.dtype();
  launch("global_avg_pool2d", detail::exec_device(x.device()), {&x}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu && nhwc)
      WEFT_GPU_KERNEL("global_avg_pool2d", global_avg_pool2d_forward_nhwc(*ctx.gpu, t, io.out[0], io.in[0], n, hw, c));
    else if (ctx.gpu)
      WEFT_GPU_KERNEL("global_avg_pool2d", global_avg_pool2d_forward(*ctx.gpu, t, io.out[0], io.in[0], planes, hw));
    else if (nhwc)
      cpu::global_avg_pool2d_forward_nhwc(io.o(0), io.i(0), n, hw, c);
    else
      cpu::global_avg_pool2d_forward(io.o(0), io.i(0), planes, hw);
  });
  return y;
}

Tensor global_avg_pool2d_backward(const Tensor& dy, const Shape& x_shape, MemoryFormat x_format) {
  check_all("global_avg_pool2d_backward", {{&dy, "dy"}});
  if (x_shape.rank() != 4 || dy.shape() != Shape{x_shape[0], x_shape[1], 1, 1})
    throw Error("global_avg_pool2d_backward: dy " + describe(dy) + " does not match input " + x_shape.str() +
                " (want [N, C, 1, 1] of an [N, C, H, W] input)");
  const std::int64_t planes = x_shape[0] * x_shape[1], hw = x_shape[2] * x_shape[3], n = x_shape[0],
                     c = x_shape[1];
  // dy [N, C, 1, 1] lies alike in both formats: read as is whatever its label.
  const bool nhwc = x_format == MemoryFormat::channels_last;
  Tensor dx = detail::make_like(dy, x_shape, dy.dtype(), x_format);
  [[maybe_unused]] const DType t = dy.dtype();
  launch("global_avg_pool2d_backward", detail::exec_device(dy.device()), {&dy}, {&dx},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu && nhwc)
             WEFT_GPU_KERNEL("global_avg_pool2d_backward",
                             global_avg_pool2d_backward_nhwc(*ctx.gpu, t, io.out[0], io.in[0], n, hw, c));
           else if (ctx.gpu)
             WEFT_GPU_KERNEL("global_avg_pool2d_backward",
                             global_avg_pool2d_backward(*ctx.gpu, t, io.out[0], io.in[0], planes, hw));
           else if (nhwc)
             cpu::global_avg_pool2d_backward_nhwc(io.o(0), io.i(0), n, hw, c);
           else
             cpu::global_avg_pool2d_backward(io.o(0), io.i(0), planes, hw);
         });
  return dx;
}

BatchNormTrain batch_norm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                                Tensor& running_var, BatchNormParams p) {
  constexpr const char* op = "batch_norm_train";
  check_all(op, {{&x, "x"}});
  check_float32_beside(op, x, {{&gamma, "gamma"}, {&beta, "beta"}, {&running_mean, "running_mean"},
                               {&running_var, "running_var"}});
  const kernels::BatchNormGeometry g = batch_norm_geometry(
      op, x, {{&gamma, "gamma"}, {&beta, "beta"}, {&running_mean, "running_mean"}, {&running_var, "running_var"}}, p);
  if (g.per_channel() < 2)
    throw Error(std::string(op) + ": x " + describe(x) + " has " + std::to_string(g.per_channel()) +
                " value(s) per channel; batch statistics need at least 2 (a larger batch, or inference mode)");
  const Shape stats{g.c};
  BatchNormTrain out{detail::make_like(x, x.shape(), x.dtype(), x.memory_format()),
                     detail::make_like(x, stats, DType::float32),
                     detail::make_like(x, stats, DType::float32)};
  const float eps = p.eps, momentum = p.momentum;
  [[maybe_unused]] const DType t = x.dtype();
  launch(op, detail::exec_device(x.device()), {&x, &gamma, &beta},
         {&out.y, &out.save_mean, &out.save_invstd, &running_mean, &running_var}, [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL(op, batch_norm_forward_train(*ctx.gpu, t, io.out[0], io.o(1), io.o(2), io.o(3), io.o(4),
                                                          io.in[0], io.i(1), io.i(2), g, eps, momentum));
           else
             cpu::batch_norm_forward_train(io.o(0), io.o(1), io.o(2), io.o(3), io.o(4), io.i(0), io.i(1), io.i(2), g,
                                           eps, momentum);
         });
  return out;
}

Tensor batch_norm_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                        const Tensor& running_var, BatchNormParams p) {
  constexpr const char* op = "batch_norm_infer";
  check_all(op, {{&x, "x"}});
  check_float32_beside(op, x, {{&gamma, "gamma"}, {&beta, "beta"}, {&running_mean, "running_mean"},
                               {&running_var, "running_var"}});
  const kernels::BatchNormGeometry g = batch_norm_geometry(
      op, x, {{&gamma, "gamma"}, {&beta, "beta"}, {&running_mean, "running_mean"}, {&running_var, "running_var"}}, p);
  Tensor y = detail::make_like(x, x.shape(), x.dtype(), x.memory_format());
  const float eps = p.eps;
  [[maybe_unused]] const DType t = x.dtype();
  launch(op, detail::exec_device(x.device()), {&x, &gamma, &beta, &running_mean, &running_var}, {&y},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL(op, batch_norm_forward_infer(*ctx.gpu, t, io.out[0], io.in[0], io.i(1), io.i(2), io.i(3),
                                                          io.i(4), g, eps));
           else
             cpu::batch_norm_forward_infer(io.o(0), io.i(0), io.i(1), io.i(2), io.i(3), io.i(4), g, eps);
         });
  return y;
}

BatchNormGrads batch_norm_backward(const Tensor& x, const Tensor& dy_in, const Tensor& gamma, const Tensor& save_mean,
                                   const Tensor& save_invstd, BatchNormParams p) {
  constexpr const char* op = "batch_norm_backward";
  check_all(op, {{&x, "x"}, {&dy_in, "dy"}});
  check_float32_beside(op, x, {{&gamma, "gamma"}, {&save_mean, "save_mean"}, {&save_invstd, "save_invstd"}});
  const kernels::BatchNormGeometry g =
      batch_norm_geometry(op, x, {{&gamma, "gamma"}, {&save_mean, "save_mean"}, {&save_invstd, "save_invstd"}}, p);
  if (dy_in.shape() != x.shape())
    throw Error(std::string(op) + ": dy " + describe(dy_in) + " does not match x " + describe(x));
  const Tensor dy = detail::as_format(dy_in, x.memory_format());
  BatchNormGrads out{detail::make_like(x, x.shape(), x.dtype(), x.memory_format()),
                     detail::make_like(x, gamma.shape(), DType::float32),
                     detail::make_like(x, gamma.shape(), DType::float32)};
  [[maybe_unused]] const float eps = p.eps;  // cuDNN wants it; the CPU uses the saved statistics
  [[maybe_unused]] const DType t = x.dtype();
  launch(op, detail::exec_device(x.device()), {&x, &dy, &gamma, &save_mean, &save_invstd},
         {&out.dx, &out.dgamma, &out.dbeta}, [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL(op, batch_norm_backward(*ctx.gpu, t, io.out[0], io.o(1), io.o(2), io.in[0], io.in[1],
                                                     io.i(2), io.i(3), io.i(4), g, eps));
           else
             cpu::batch_norm_backward(io.o(0), io.o(1), io.o(2), io.i(0), io.i(1), io.i(2), io.i(3), io.i(4), g);
         });
  return out;
}

SoftmaxCrossEntropy softmax_cross_entropy(const Tensor& logits, const Tensor& labels) {
  check_all("softmax_cross_entropy", {{&logits, "logits"}});
  check_float32_beside("softmax_cross_entropy", logits, {{&labels, "labels"}});
  detail::check_rank("softmax_cross_entropy", logits, 2, "logits");
  const std::int64_t rows = logits.shape()[0], cols = logits.shape()[1];
  if (labels.shape() != Shape{rows})
    throw Error("softmax_cross_entropy: labels " + describe(labels) + " do not match logits " + describe(logits) +
                " (want [" + std::to_string(rows) + "])");
  if (cols == 0) throw Error("softmax_cross_entropy: logits " + describe(logits) + " have no classes");
  SoftmaxCrossEntropy out{detail::make_like(logits, Shape{}, DType::float32),
                          detail::make_like(logits, logits.shape())};
  [[maybe_unused]] const DType t = logits.dtype();
  launch("softmax_cross_entropy", detail::exec_device(logits.device()), {&logits, &labels}, {&out.loss, &out.dlogits},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL("softmax_cross_entropy", softmax_cross_entropy(*ctx.gpu, t, io.o(0), io.out[1], io.in[0],
                                                                            io.i(1), rows, cols));
           else
             cpu::softmax_cross_entropy(io.o(0), io.o(1), io.i(0), io.i(1), rows, cols);
         });
  return out;
}

namespace {

// q, k, v (and, for backward, out and dout): [B, H, T, D], one shape, one
// floating dtype, one device, contiguous; a finite scale.
void check_attention(const char* op, std::initializer_list<std::pair<const Tensor*, const char*>> tensors,
                     float scale) {
  check_all(op, tensors);
  const auto& [first, first_what] = *tensors.begin();
  for (auto [t, what] : tensors) {
    detail::check_rank(op, *t, 4, what);
    detail::check_not_channels_last(op, *t, what);
    if (t->shape() != first->shape())
      throw Error(std::string(op) + ": " + what + " " + describe(*t) + " does not match " + first_what + " " +
                  describe(*first) + " (want [B, H, T, D] alike)");
  }
  if (!std::isfinite(scale))
    throw Error(std::string(op) + ": scale " + std::to_string(scale) + " is not finite");
}

// The CUDA kernels' float32 scores, [planes, t, t] (docs/design/attention.md),
// `copies` of them, and how an error names them.
std::size_t attention_scores_bytes(std::int64_t planes, std::int64_t t, int copies) {
  return static_cast<std::size_t>(copies) * static_cast<std::size_t>(planes) * static_cast<std::size_t>(t) *
         static_cast<std::size_t>(t) * sizeof(float);
}
std::string attention_scores_what(std::int64_t planes, std::int64_t t, int copies) {
  const std::string shape = "[" + std::to_string(planes) + ", " + std::to_string(t) + ", " + std::to_string(t) + "]";
  return copies == 1 ? "the " + shape + " float32 scores" : "the " + shape + " float32 scores and their gradients";
}

// Multiply-adds of the causal products, counted twice: about half of T x T
// scores, each a D-long dot product, and as many for the values.
double attention_flops(const Shape& s) {
  const double planes = static_cast<double>(s[0]) * static_cast<double>(s[1]);
  const double t = static_cast<double>(s[2]), d = static_cast<double>(s[3]);
  return 2.0 * planes * t * (t + 1.0) * d;
}

}  // namespace

CausalAttention causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, float scale) {
  constexpr const char* op = "causal_attention";
  check_attention(op, {{&q, "q"}, {&k, "k"}, {&v, "v"}}, scale);
  const Shape& s = q.shape();
  const std::int64_t planes = s[0] * s[1], t = s[2], d = s[3];
  [[maybe_unused]] const std::int64_t s0 = s[0], s1 = s[1];
  CausalAttention out{detail::make_like(q, s), detail::make_like(q, Shape{s[0], s[1], t}, DType::float32)};
  [[maybe_unused]] const DType dt = q.dtype();
  launch(op, detail::exec_device(q.device()), {&q, &k, &v}, {&out.out, &out.lse},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu) {
#if WEFT_HAVE_CUDA
             namespace kg = ::weft::kernels::gpu;
             if (const auto f = kg::fused_attention_plan(
                     *ctx.gpu, dt, false, s0, s1, t, d, scale, kg::attention_impl_from_env(),
                     kg::aligned16({io.out[0], io.o(1), io.in[0], io.in[1], io.in[2]}))) {
               const detail::GpuScratch ws(ctx, std::max<std::size_t>(f->workspace_bytes, 256),
                                           "the fused attention's cuDNN workspace");
               kg::causal_attention_fused_forward(*ctx.gpu, *f, io.out[0], io.o(1), io.in[0], io.in[1], io.in[2],
                                                 scale, ws.floats());
               return;
             }
#endif
             const detail::GpuScratch scores(ctx, attention_scores_bytes(planes, t, 1),
                                             attention_scores_what(planes, t, 1));
             WEFT_GPU_KERNEL(op, causal_attention_forward(*ctx.gpu, dt, io.out[0], io.o(1), io.in[0], io.in[1],
                                                          io.in[2], planes, t, d, scale, scores.floats()));
             return;
           }
           cpu::causal_attention_forward(io.o(0), io.o(1), io.i(0), io.i(1), io.i(2), planes, t, d, scale);
         }, OpProperty::normal, 0, detail::Body::kernels, false,
         detail::OpCost{attention_flops(s), 0, static_cast<double>(planes) * static_cast<double>(t)});
  return out;
}

CausalAttentionGrads causal_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                               const Tensor& dout, const Tensor& lse, float scale) {
  constexpr const char* op = "causal_attention_backward";
  check_attention(op, {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&dout, "dout"}}, scale);
  check_float32_beside(op, q, {{&lse, "lse"}});
  const Shape& s = q.shape();
  if (lse.shape() != Shape{s[0], s[1], s[2]})
    throw Error(std::string(op) + ": lse " + describe(lse) + " does not match q " + describe(q) + " (want [" +
                std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + "])");
  const std::int64_t planes = s[0] * s[1], t = s[2], d = s[3];
  [[maybe_unused]] const std::int64_t s0 = s[0], s1 = s[1];
  CausalAttentionGrads g{detail::make_like(q, s), detail::make_like(q, s), detail::make_like(q, s)};
  [[maybe_unused]] const DType dt = q.dtype();
  // Deterministic (Engine::conv_algo()): the GEMM path, whose reductions
  // have a fixed order, unless WEFT_ATTENTION_IMPL asks for the fused one.
  [[maybe_unused]] const bool deterministic = q.engine().conv_algo().deterministic;
  launch(op, detail::exec_device(q.device()), {&q, &k, &v, &out, &dout, &lse}, {&g.dq, &g.dk, &g.dv},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu) {
#if WEFT_HAVE_CUDA
             namespace kg = ::weft::kernels::gpu;
             kg::AttentionImpl impl = kg::attention_impl_from_env();
             if (deterministic && impl == kg::AttentionImpl::automatic) impl = kg::AttentionImpl::gemm;
             if (const auto f = kg::fused_attention_plan(
                     *ctx.gpu, dt, true, s0, s1, t, d, scale, impl,
                     kg::aligned16({io.out[0], io.out[1], io.out[2], io.in[0], io.in[1], io.in[2], io.in[3],
                                    io.in[4], io.in[5]}))) {
               const detail::GpuScratch ws(ctx, std::max<std::size_t>(f->workspace_bytes, 256),
                                           "the fused attention's cuDNN workspace");
               kg::causal_attention_fused_backward(*ctx.gpu, *f, io.out[0], io.out[1], io.out[2], io.in[0], io.in[1],
                                                  io.in[2], io.in[3], io.in[4], io.i(5), s0, s1, t, scale,
                                                  ws.floats());
               return;
             }
#endif
             // The scores and their gradients, one after the other.
             const detail::GpuScratch scores(ctx, attention_scores_bytes(planes, t, 2),
                                             attention_scores_what(planes, t, 2));
             WEFT_GPU_KERNEL(op, causal_attention_backward(*ctx.gpu, dt, io.out[0], io.out[1], io.out[2], io.in[0],
                                                           io.in[1], io.in[2], io.in[3], io.in[4], io.i(5), planes, t,
                                                           d, scale, scores.floats()));
             return;
           }
           cpu::causal_attention_backward(io.o(0), io.o(1), io.o(2), io.i(0), io.i(1), io.i(2), io.i(3), io.i(4),
                                          io.i(5), planes, t, d, scale);
         }, OpProperty::normal, 0, detail::Body::kernels, false,
         detail::OpCost{2.5 * attention_flops(s), 0, static_cast<double>(planes) * static_cast<double>(t)});
  return g;
}

void sgd_update(Tensor& w, const Tensor& g, float lr, float weight_decay) {
  sgd_update(w, g, lr, weight_decay, Tensor());
}

void sgd_update(Tensor& w, const Tensor& g, float lr, float weight_decay, const Tensor& skip) {
  detail::check_float32("sgd_update", w, "w");
  check_float32_beside("sgd_update", w, {{&g, "grad"}});
  detail::check_same_shape("sgd_update", w, g);
  if (g.memory_format() != w.memory_format())
    throw InvalidArgument("sgd_update: grad " + describe(g) + " is " + std::string(to_string(g.memory_format())) +
                          " but w " + describe(w) + " is " + std::string(to_string(w.memory_format())) +
                          " (ops::to_memory_format converts)");
  const bool has_skip = skip.defined();
  if (has_skip) {
    check_float32_beside("sgd_update", w, {{&skip, "skip"}});
    if (skip.numel() != 1)
      throw InvalidArgument("sgd_update: skip " + describe(skip) + " must hold one element (the found-inf flag)");
  }
  const std::int64_t n = w.numel();
  launch("sgd_update", detail::exec_device(w.device()), {&g, &skip}, {&w}, [=](RunContext& ctx, OpIO& io) {
    const float* flag = has_skip ? io.i(1) : nullptr;
    if (ctx.gpu)
      WEFT_GPU_KERNEL("sgd_update", sgd_update(*ctx.gpu, io.o(0), io.i(0), n, lr, weight_decay, flag));
    else
      cpu::sgd_update(io.o(0), io.i(0), n, lr, weight_decay, flag);
  });
}

// ---- dynamic loss scaling ----------------------------------------------

Tensor unscale_and_check(const std::vector<Tensor>& grads, const Tensor& scale) {
  constexpr const char* op = "unscale_and_check";
  detail::check_float32(op, scale, "scale");
  if (scale.numel() != 1) throw InvalidArgument(std::string(op) + ": scale " + describe(scale) + " must hold one element");
  std::vector<const Tensor*> outputs;
  std::vector<std::int64_t> sizes;
  for (std::size_t k = 0; k < grads.size(); ++k) {
    const std::string what = "grad " + std::to_string(k);
    check_float32_beside(op, scale, {{&grads[k], what.c_str()}});
    for (std::size_t j = 0; j < k; ++j)
      if (grads[j].overlaps(grads[k]))
        throw InvalidArgument(std::string(op) + ": grads " + std::to_string(j) + " and " + std::to_string(k) +
                              " are one tensor, " + describe(grads[k]));
    outputs.push_back(&grads[k]);
    sizes.push_back(grads[k].numel());
  }
  Tensor found_inf = Tensor::zeros(scale.engine(), Shape{1}, scale.device());
  outputs.push_back(&found_inf);
  launch(op, detail::exec_device(scale.device()), {&scale}, outputs, [sizes](RunContext& ctx, OpIO& io) {
    float* flag = io.o(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      if (sizes[k] == 0) continue;
      if (ctx.gpu)
        WEFT_GPU_KERNEL("unscale_and_check", unscale_and_check(*ctx.gpu, io.o(k), sizes[k], io.i(0), flag));
      else
        cpu::unscale_and_check(io.o(k), sizes[k], io.i(0), flag);
    }
  });
  return found_inf;
}

void update_loss_scale(Tensor& scale, Tensor& growth_tracker, Tensor& skipped, const Tensor& found_inf,
                       const LossScaleRule& rule) {
  constexpr const char* op = "update_loss_scale";
  detail::check_float32(op, scale, "scale");
  check_float32_beside(op, scale, {{&growth_tracker, "growth_tracker"}, {&skipped, "skipped"}, {&found_inf, "found_inf"}});
  for (const Tensor* t : std::initializer_list<const Tensor*>{&scale, &growth_tracker, &skipped, &found_inf})
    if (t->numel() != 1) throw InvalidArgument(std::string(op) + ": " + describe(*t) + " must hold one element");
  if (!(rule.growth_factor >= 1.0f) || !(rule.backoff_factor > 0.0f && rule.backoff_factor <= 1.0f) ||
      rule.growth_interval < 1)
    throw InvalidArgument(std::string(op) + ": growth_factor " + std::to_string(rule.growth_factor) +
                          ", backoff_factor " + std::to_string(rule.backoff_factor) + ", growth_interval " +
                          std::to_string(rule.growth_interval) +
                          " (want growth >= 1, 0 < backoff <= 1, interval >= 1)");
  const float growth = rule.growth_factor, backoff = rule.backoff_factor;
  const std::int64_t interval = rule.growth_interval;
  launch(op, detail::exec_device(scale.device()), {&found_inf}, {&scale, &growth_tracker, &skipped},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL("update_loss_scale", update_loss_scale(*ctx.gpu, io.o(0), io.o(1), io.o(2), io.i(0),
                                                                    growth, backoff, interval));
           else
             cpu::update_loss_scale(io.o(0), io.o(1), io.o(2), io.i(0), growth, backoff, interval);
         });
}

}  // namespace weft::ops
