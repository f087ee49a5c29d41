// Elementwise ops, reductions and matmul: checks at push time, then one op.
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "launch.h"
#include "weft/ops.h"

namespace weft::ops {

using detail::launch;
using detail::OpIO;
namespace cpu = kernels::cpu;

namespace {

// The output takes a's memory format; b in the other one is converted first.
template <class Cpu, class Gpu>
Tensor binary(const char* op, const Tensor& a, const Tensor& b_in, Cpu cpu_kernel, Gpu gpu_kernel,
              const char* what_a = "a", const char* what_b = "b") {
  detail::check_floating(op, a, what_a);
  detail::check_floating(op, b_in, what_b);
  detail::check_same_device(op, a, b_in);
  detail::check_same_dtype(op, a, what_a, b_in, what_b);
  detail::check_same_shape(op, a, b_in);
  const Tensor b = detail::as_format(b_in, a.memory_format());
  Tensor y = detail::make_like(a, a.shape(), a.dtype(), a.memory_format());
  const std::int64_t n = a.numel();
  [[maybe_unused]] const DType t = a.dtype();
  launch(op, detail::exec_device(a.device()), {&a, &b}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      gpu_kernel(*ctx.gpu, t, io.out[0], io.in[0], io.in[1], n);
    else
      cpu_kernel(io.o(0), io.i(0), io.i(1), n);
  });
  return y;
}

template <class Cpu, class Gpu>
Tensor unary(const char* op, const Tensor& x, Cpu cpu_kernel, Gpu gpu_kernel) {
  detail::check_floating(op, x, "x");
  Tensor y = detail::make_like(x, x.shape(), x.dtype(), x.memory_format());
  const std::int64_t n = x.numel();
  [[maybe_unused]] const DType t = x.dtype();
  launch(op, detail::exec_device(x.device()), {&x}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      gpu_kernel(*ctx.gpu, t, io.out[0], io.in[0], n);
    else
      cpu_kernel(io.o(0), io.i(0), n);
  });
  return y;
}

}  // namespace

#define WEFT_BINARY(name)                                                                              \
  Tensor name(const Tensor& a, const Tensor& b) {                                                      \
    return binary(                                                                                     \
        #name, a, b, [](float* y, const float* p, const float* q, std::int64_t n) { cpu::name(y, p, q, n); }, \
        [](const gpu::WorkerHandles& h, DType t, void* y, const void* p, const void* q, std::int64_t n) { \
          (void)h, (void)t, (void)y, (void)p, (void)q, (void)n;                                        \
          WEFT_GPU_KERNEL(#name, name(h, t, y, p, q, n));                                              \
        });                                                                                            \
  }
WEFT_BINARY(add)
WEFT_BINARY(sub)
WEFT_BINARY(mul)
#undef WEFT_BINARY

Tensor add_scalar(const Tensor& x, float s) {
  return unary(
      "add_scalar", x, [s](float* y, const float* p, std::int64_t n) { cpu::add_scalar(y, p, s, n); },
      [s](const gpu::WorkerHandles& h, DType t, void* y, const void* p, std::int64_t n) {
        (void)h, (void)t, (void)y, (void)p, (void)n, (void)s;
        WEFT_GPU_KERNEL("add_scalar", add_scalar(h, t, y, p, s, n));
      });
}

Tensor mul_scalar(const Tensor& x, float s) {
  return unary(
      "mul_scalar", x, [s](float* y, const float* p, std::int64_t n) { cpu::mul_scalar(y, p, s, n); },
      [s](const gpu::WorkerHandles& h, DType t, void* y, const void* p, std::int64_t n) {
        (void)h, (void)t, (void)y, (void)p, (void)n, (void)s;
        WEFT_GPU_KERNEL("mul_scalar", mul_scalar(h, t, y, p, s, n));
      });
}

Tensor relu(const Tensor& x) {
  return unary(
      "relu", x, [](float* y, const float* p, std::int64_t n) { cpu::relu(y, p, n); },
      [](const gpu::WorkerHandles& h, DType t, void* y, const void* p, std::int64_t n) {
        (void)h, (void)t, (void)y, (void)p, (void)n;
        WEFT_GPU_KERNEL("relu", relu(h, t, y, p, n));
      });
}

Tensor relu_grad(const Tensor& x, const Tensor& dy) {
  return binary(
      "relu_grad", x, dy, [](float* dx, const float* p, const float* q, std::int64_t n) { cpu::relu_grad(dx, p, q, n); },
      [](const gpu::WorkerHandles& h, DType t, void* dx, const void* p, const void* q, std::int64_t n) {
        (void)h, (void)t, (void)dx, (void)p, (void)q, (void)n;
        WEFT_GPU_KERNEL("relu_grad", relu_grad(h, t, dx, p, q, n));
      },
      "x", "dy");
}

Tensor cast(const Tensor& x, DType dtype) {
  detail::check_floating("cast", x, "x");
  if (!has_kernels(dtype))
    throw InvalidArgument("cast: to dtype " + std::string(to_string(dtype)) + " for x " + detail::describe_on(x) +
                          "; float32, bfloat16 and float16 are supported");
  Tensor y = detail::make_like(x, x.shape(), dtype, x.memory_format());
  const std::int64_t n = x.numel();
  const DType from = x.dtype();
  launch(std::string("cast to ") + std::string(to_string(dtype)), detail::exec_device(x.device()), {&x}, {&y},
         [=](RunContext& ctx, OpIO& io) {
           if (ctx.gpu)
             WEFT_GPU_KERNEL("cast", cast(*ctx.gpu, io.out[0], dtype, io.in[0], from, n));
           else
             cpu::cast(io.out[0], dtype, io.in[0], from, n);
         },
         OpProperty::normal, 0, detail::Body::bytes);
  return y;
}

Tensor scale_by(const Tensor& x, const Tensor& factor) {
  detail::check_floating("scale_by", x, "x");
  detail::check_float32("scale_by", factor, "factor");
  detail::check_same_device("scale_by", x, factor);
  if (factor.numel() != 1)
    throw InvalidArgument("scale_by: factor " + detail::describe(factor) + " must hold one element");
  Tensor y = detail::make_like(x, x.shape(), x.dtype(), x.memory_format());
  const std::int64_t n = x.numel();
  [[maybe_unused]] const DType t = x.dtype();
  launch("scale_by", detail::exec_device(x.device()), {&x, &factor}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("scale_by", scale_by(*ctx.gpu, t, io.out[0], io.in[0], io.i(1), n));
    else
      cpu::mul_scalar(io.o(0), io.i(0), *io.i(1), n);
  });
  return y;
}

void axpy(float alpha, const Tensor& x_in, Tensor& y) {
  detail::check_floating("axpy", x_in, "x");
  detail::check_floating("axpy", y, "y");
  detail::check_same_device("axpy", x_in, y);
  detail::check_same_dtype("axpy", x_in, "x", y, "y");
  detail::check_same_shape("axpy", x_in, y);
  const Tensor x = detail::as_format(x_in, y.memory_format());
  const std::int64_t n = x.numel();
  [[maybe_unused]] const DType t = x.dtype();
  launch("axpy", detail::exec_device(y.device()), {&x}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("axpy", axpy(*ctx.gpu, t, io.out[0], alpha, io.in[0], n));
    else
      cpu::axpy(io.o(0), alpha, io.i(0), n);
  });
}

namespace {
// The element count of a pack's srcs (or an unpack's dsts), checked against
// `flat` (the packed tensor): same device, float32 (or, with any_dtype,
// one floating dtype), counts adding up.
std::int64_t check_runs(const char* op, const std::vector<Tensor>& runs, const char* what, const Tensor& flat,
                        bool any_dtype = false) {
  if (any_dtype)
    detail::check_floating(op, flat, "the packed tensor");
  else
    detail::check_float32(op, flat, "the packed tensor");
  if (runs.empty()) throw InvalidArgument(std::string(op) + ": no " + what + "s");
  std::int64_t total = 0;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const std::string name = std::string(what) + " " + std::to_string(k);
    if (any_dtype)
      detail::check_same_dtype(op, runs[k], name.c_str(), flat, "the packed tensor");
    else
      detail::check_float32(op, runs[k], name.c_str());
    detail::check_not_channels_last(op, runs[k], name.c_str());
    if (runs[k].device() != flat.device())
      throw InvalidArgument(std::string(op) + ": " + name + " " + detail::describe_on(runs[k]) + " is not on " +
                            flat.device().str() + ", where the packed tensor " + detail::describe(flat) + " is");
    total += runs[k].numel();
  }
  if (total != flat.numel())
    throw InvalidArgument(std::string(op) + ": the " + what + "s hold " + std::to_string(total) +
                          " elements but the packed tensor " + detail::describe(flat) + " holds " +
                          std::to_string(flat.numel()));
  return total;
}

std::vector<std::int64_t> run_sizes(const std::vector<Tensor>& runs) {
  std::vector<std::int64_t> n;
  n.reserve(runs.size());
  for (const Tensor& t : runs) n.push_back(t.numel());
  return n;
}
}  // namespace

void pack(const std::vector<Tensor>& srcs, Tensor& dst, float alpha, bool accumulate) {
  const bool plain_copy = alpha == 1.0f && !accumulate;
  check_runs("pack", srcs, "src", dst, plain_copy);
  std::vector<const Tensor*> inputs;
  for (const Tensor& t : srcs) inputs.push_back(&t);
  if (plain_copy && dst.dtype() != DType::float32) {  // a byte copy, in any floating dtype
    const DType t = dst.dtype();
    launch("pack", detail::exec_device(dst.device()), inputs, {&dst},
           [t, sizes = run_sizes(srcs)](RunContext& ctx, OpIO& io) {
             std::int64_t offset = 0;
             const std::size_t size = dtype_size(t);
             for (std::size_t k = 0; k < sizes.size(); ++k) {
               auto* y = static_cast<unsigned char*>(io.out[0]) + offset * static_cast<std::int64_t>(size);
               const std::int64_t n = sizes[k];
               offset += n;
               if (n == 0) continue;
               if (ctx.gpu)
                 WEFT_GPU_KERNEL("pack", mul_scalar(*ctx.gpu, t, y, io.in[k], 1.0f, n));
               else
                 std::memcpy(y, io.in[k], static_cast<std::size_t>(n) * size);
             }
           }, OpProperty::normal, 0, detail::Body::bytes);
    return;
  }
  launch("pack", detail::exec_device(dst.device()), inputs, {&dst},
         [alpha, accumulate, sizes = run_sizes(srcs)](RunContext& ctx, OpIO& io) {
           std::int64_t offset = 0;
           for (std::size_t k = 0; k < sizes.size(); ++k) {
             float* y = io.o(0) + offset;
             const float* x = io.i(k);
             const std::int64_t n = sizes[k];
             offset += n;
             if (n == 0) continue;
             if (ctx.gpu) {
               if (accumulate)
                 WEFT_GPU_KERNEL("pack", axpy(*ctx.gpu, DType::float32, y, alpha, x, n));
               else
                 WEFT_GPU_KERNEL("pack", mul_scalar(*ctx.gpu, DType::float32, y, x, alpha, n));
             } else if (accumulate) {
               cpu::axpy(y, alpha, x, n);
             } else if (alpha == 1.0f) {
               cpu::copy(y, x, n);
             } else {
               cpu::mul_scalar(y, x, alpha, n);
             }
           }
         });
}

Tensor slice_rows(const Tensor& x, std::int64_t begin, std::int64_t end) {
  detail::check_floating("slice_rows", x, "x");
  if (x.shape().rank() == 0)
    throw InvalidArgument("slice_rows: x " + detail::describe(x) + " has no rows (a scalar)");
  const std::int64_t rows = x.shape()[0];
  if (begin < 0 || end < begin || end > rows)
    throw InvalidArgument("slice_rows: rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") of x " +
                          detail::describe(x) +
                          ", which has " + std::to_string(rows));
  std::vector<std::int64_t> dims = x.shape().dims();
  dims[0] = end - begin;
  // Rows are whole images in both formats: the slice keeps x's.
  Tensor y = detail::make_like(x, Shape(std::move(dims)), x.dtype(), x.memory_format());
  const std::int64_t row = rows > 0 ? x.numel() / rows : 0, offset = begin * row, n = y.numel();
  [[maybe_unused]] const DType t = x.dtype();
  launch("slice_rows", detail::exec_device(x.device()), {&x}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (n == 0) return;
    const auto* from = static_cast<const unsigned char*>(io.in[0]) + offset * static_cast<std::int64_t>(dtype_size(t));
    if (ctx.gpu)
      WEFT_GPU_KERNEL("slice_rows", mul_scalar(*ctx.gpu, t, io.out[0], from, 1.0f, n));
    else
      std::memcpy(io.out[0], from, static_cast<std::size_t>(n) * dtype_size(t));
  }, OpProperty::normal, 0, detail::Body::bytes);
  return y;
}

void unpack(const Tensor& src, const std::vector<Tensor>& dsts) {
  check_runs("unpack", dsts, "dst", src);
  std::vector<const Tensor*> outputs;
  for (std::size_t k = 0; k < dsts.size(); ++k) {
    for (std::size_t j = 0; j < k; ++j)
      if (dsts[j].overlaps(dsts[k]))
        throw InvalidArgument("unpack: dsts " + std::to_string(j) + " and " + std::to_string(k) + " are one tensor, " +
                              detail::describe(dsts[k]));
    outputs.push_back(&dsts[k]);
  }
  launch("unpack", detail::exec_device(src.device()), {&src}, outputs,
         [sizes = run_sizes(dsts)](RunContext& ctx, OpIO& io) {
           std::int64_t offset = 0;
           for (std::size_t k = 0; k < sizes.size(); ++k) {
             const float* x = io.i(0) + offset;
             float* y = io.o(k);
             const std::int64_t n = sizes[k];
             offset += n;
             if (n == 0) continue;
             if (ctx.gpu)
               WEFT_GPU_KERNEL("unpack", mul_scalar(*ctx.gpu, DType::float32, y, x, 1.0f, n));
             else
               cpu::copy(y, x, n);
           }
         });
}

namespace {
Tensor reduce_sum(const char* op, const Tensor& x, float scale) {
  detail::check_floating(op, x, "x");
  Tensor y = detail::make_like(x, Shape{});
  const std::int64_t n = x.numel();
  [[maybe_unused]] const DType t = x.dtype();
  launch(op, detail::exec_device(x.device()), {&x}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu) {
      WEFT_GPU_KERNEL(op, sum(*ctx.gpu, t, io.out[0], io.in[0], n));
      if (scale != 1.0f) WEFT_GPU_KERNEL(op, mul_scalar(*ctx.gpu, t, io.out[0], io.out[0], scale, 1));
    } else {
      cpu::sum(io.o(0), io.i(0), n);
      *io.o(0) *= scale;
    }
  });
  return y;
}
}  // namespace

Tensor sum(const Tensor& x) { return reduce_sum("sum", x, 1.0f); }

Tensor mean(const Tensor& x) {
  const std::int64_t n = x.defined() ? x.numel() : 1;
  return reduce_sum("mean", x, n ? 1.0f / static_cast<float>(n) : std::numeric_limits<float>::quiet_NaN());
}

Tensor argmax(const Tensor& x) {
  detail::check_floating("argmax", x, "x");
  detail::check_rank("argmax", x, 2, "x");
  const std::int64_t rows = x.shape()[0], cols = x.shape()[1];
  if (cols == 0 && rows > 0) throw Error("argmax: x " + detail::describe(x) + " has rows with no columns");
  Tensor y = detail::make_like(x, Shape{rows}, DType::float32);  // indices
  [[maybe_unused]] const DType t = x.dtype();
  launch("argmax", detail::exec_device(x.device()), {&x}, {&y}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("argmax", argmax_rows(*ctx.gpu, t, io.o(0), io.in[0], rows, cols));
    else
      cpu::argmax_rows(io.o(0), io.i(0), rows, cols);
  });
  return y;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  detail::check_floating("matmul", a, "a");
  detail::check_floating("matmul", b, "b");
  detail::check_same_device("matmul", a, b);
  detail::check_same_dtype("matmul", a, "a", b, "b");
  detail::check_rank("matmul", a, 2, "a");
  detail::check_rank("matmul", b, 2, "b");
  const std::int64_t m = trans_a ? a.shape()[1] : a.shape()[0];
  const std::int64_t k = trans_a ? a.shape()[0] : a.shape()[1];
  const std::int64_t kb = trans_b ? b.shape()[1] : b.shape()[0];
  const std::int64_t n = trans_b ? b.shape()[0] : b.shape()[1];
  if (k != kb)
    throw Error("matmul: inner dimensions differ: " + detail::describe(a) + (trans_a ? "^T" : "") + " x " +
                detail::describe(b) + (trans_b ? "^T" : "") + " (" + std::to_string(k) + " vs " + std::to_string(kb) +
                ")");
  Tensor c = detail::make_like(a, Shape{m, n});
  const std::int64_t lda = a.shape()[1], ldb = b.shape()[1];
  [[maybe_unused]] const DType t = a.dtype();
  const bool tf32 = t == DType::float32 && AllowTf32::active();
  launch("matmul", detail::exec_device(a.device()), {&a, &b}, {&c}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL("matmul", gemm(*ctx.gpu, t, tf32, trans_a, trans_b, m, n, k, 1.0f, io.in[0], lda, io.in[1], ldb,
                                     0.0f, io.out[0], n));
    else
      cpu::gemm(trans_a, trans_b, m, n, k, 1.0f, io.i(0), lda, io.i(1), ldb, 0.0f, io.o(0), n);
  }, OpProperty::normal, 0, detail::Body::kernels, tf32,
         detail::OpCost{2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k), 0,
                        static_cast<double>(m) * static_cast<double>(n)});
  return c;
}

Tensor batched_matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  constexpr const char* op = "batched_matmul";
  detail::check_floating(op, a, "a");
  detail::check_floating(op, b, "b");
  detail::check_same_device(op, a, b);
  detail::check_same_dtype(op, a, "a", b, "b");
  detail::check_rank(op, a, 3, "a");
  detail::check_rank(op, b, 3, "b");
  const Shape &sa = a.shape(), &sb = b.shape();
  const auto shown = [&] {
    return detail::describe(a) + (trans_a ? "^T" : "") + " x " + detail::describe(b) + (trans_b ? "^T" : "");
  };
  if (sa[0] != sb[0])
    throw InvalidArgument(std::string(op) + ": batch sizes differ: " + shown() + " (" + std::to_string(sa[0]) +
                          " vs " + std::to_string(sb[0]) + ")");
  const std::int64_t batch = sa[0];
  const std::int64_t m = trans_a ? sa[2] : sa[1], k = trans_a ? sa[1] : sa[2];
  const std::int64_t kb = trans_b ? sb[2] : sb[1], n = trans_b ? sb[1] : sb[2];
  if (k != kb)
    throw InvalidArgument(std::string(op) + ": inner dimensions differ: " + shown() + " (" + std::to_string(k) +
                          " vs " + std::to_string(kb) + ")");
  Tensor c = detail::make_like(a, Shape{batch, m, n});
  const std::int64_t lda = sa[2], ldb = sb[2], stride_a = sa[1] * sa[2], stride_b = sb[1] * sb[2], stride_c = m * n;
  [[maybe_unused]] const DType t = a.dtype();
  const bool tf32 = t == DType::float32 && AllowTf32::active();
  const double d_b = static_cast<double>(batch), d_m = static_cast<double>(m), d_n = static_cast<double>(n);
  launch(op, detail::exec_device(a.device()), {&a, &b}, {&c}, [=](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      WEFT_GPU_KERNEL(op, gemm_batched(*ctx.gpu, t, tf32, trans_a, trans_b, batch, m, n, k, 1.0f, io.in[0], lda,
                                       stride_a, io.in[1], ldb, stride_b, 0.0f, io.out[0], n, stride_c));
    else
      cpu::gemm_batched(trans_a, trans_b, batch, m, n, k, 1.0f, io.i(0), lda, stride_a, io.i(1), ldb, stride_b, 0.0f,
                        io.o(0), n, stride_c);
  }, OpProperty::normal, 0, detail::Body::kernels, tf32,
         detail::OpCost{2.0 * d_b * d_m * d_n * static_cast<double>(k), 0, d_b * d_m * d_n});
  return c;
}

}  // namespace weft::ops
