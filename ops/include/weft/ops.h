// Tensor ops. Each checks its arguments at push time and throws weft::Error
// naming the op and the offending tensors ('x' [2, 3], or [2, 3] unnamed; dtype
// and device where they are the problem); then pushes one engine op on the
// inputs' device and returns the output at once. All inputs of an op must be
// on one device (copy_to moves data between devices) and of one dtype:
// float32, bfloat16 or float16 (cast converts; a mix is a weft::InvalidArgument
// naming both tensors and dtypes). Outputs take the inputs' dtype. Half
// tensors compute in float32 and round on store, GEMMs accumulate in float32.
#pragma once

#include <string>
#include <vector>

#include "weft/tensor.h"

namespace weft::ops {

// While alive, every op this thread pushes through the ops layer (the ops
// below, weft/nn_ops.h, Tensor's methods, the nn layers) gets `priority`
// (higher runs first among ready ops of a device) and has " [label]"
// appended to its name (traces, the profiler's tables, errors). Scopes nest:
// the innermost one counts. A pipeline marks each stage's actions so
// ("conv2d [stage 1 F3]"), with backward over forward. `after`, when not
// null, is read by every such op as well: none starts before the last op
// pushed earlier that writes it is done, and an op pushed later that writes
// it waits for all of them (a phony dependency, as torchgpipe's fork and
// join: a pipeline runs each rank's actions in its list's order so).
// `chain`, when not null, is written by every such op: each waits for the
// op pushed before it that wrote `chain`, so ops of scopes on one chain
// start in push order (a pipeline's incoming copies, on a GPU's one peer
// stream, in the receiver's list order).
class PushScope {
 public:
  PushScope(int priority, std::string label, Var after = {}, Var chain = {});
  ~PushScope();
  PushScope(const PushScope&) = delete;
  PushScope& operator=(const PushScope&) = delete;

 private:
  int saved_priority_;
  std::string saved_label_;
  Var saved_after_, saved_chain_;
};

// While alive, every op this thread pushes through the ops layer also
// reads `var`: none starts before the last op pushed earlier that writes it
// is done (a phony dependency that holds work whose inputs are ready long
// before it should run, and so its memory: activation recomputation waits
// for the gradient that reaches its segment). Nests with PushScope and
// other WaitFor scopes: an op waits for every one alive.
class WaitFor {
 public:
  explicit WaitFor(Var var);
  ~WaitFor();
  WaitFor(const WaitFor&) = delete;
  WaitFor& operator=(const WaitFor&) = delete;
};

// While alive, float32 GEMMs and convolutions this thread pushes (matmul,
// dense, conv2d and their backward ops) may run on TF32 tensor cores: inputs
// rounded to a 10-bit mantissa, float32 accumulation (PyTorch's allow_tf32).
// CPU devices and simulated GPUs round the inputs the same way, so they give
// what a GPU would. Scopes nest; AllowTf32(false) turns it off inside one.
class AllowTf32 {
 public:
  explicit AllowTf32(bool on = true);
  ~AllowTf32();
  AllowTf32(const AllowTf32&) = delete;
  AllowTf32& operator=(const AllowTf32&) = delete;
  static bool active() noexcept;  // this thread's current setting

 private:
  bool saved_;
};

// Threads one CPU kernel may use: every CPU op parallelizes inside one shared
// oneTBB arena of this many slots (default: weft::available_cpus(), the CPUs
// of the process's affinity mask), so
// several engine workers never oversubscribe the cores. n >= 1. Call it
// while no op runs (at start-up, or between phases after wait_all).
void set_cpu_kernel_threads(int n);
int cpu_kernel_threads();

// x converted to `dtype` (float32, bfloat16 or float16): to a half, rounded
// to nearest even, NaN and Inf kept, overflow to Inf; to float32, exact. A
// cast to x's own dtype is a copy.
Tensor cast(const Tensor& x, DType dtype);

// ---- memory formats (weft/tensor.h's MemoryFormat) ----------------------
// x's values stored in `format`: one op, "to_channels_last" or
// "to_contiguous" in traces, writing a new tensor of x's shape and dtype;
// x itself when it already is. channels_last takes a 4-D x only (else a
// weft::InvalidArgument naming the tensor and the format).
Tensor to_memory_format(const Tensor& x, MemoryFormat format);
inline Tensor contiguous(const Tensor& x) { return to_memory_format(x, MemoryFormat::contiguous); }

// Elementwise, same shapes. The output takes a's memory format; a b (or x
// of axpy, dy of relu_grad) in the other format is converted to it first
// (to_memory_format's op). Reductions read any format.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& x, float s);
Tensor mul_scalar(const Tensor& x, float s);
void axpy(float alpha, const Tensor& x, Tensor& y);  // y += alpha * x, in place (writes y)
// x * factor[0], factor a [1] float32 tensor on x's device read when the op
// runs (a loss scale that lives on the device).
Tensor scale_by(const Tensor& x, const Tensor& factor);
Tensor relu(const Tensor& x);
Tensor relu_grad(const Tensor& x, const Tensor& dy);  // dy where x > 0

// Flat concatenation, for gradient buckets: `dst` (float32, numel = the sum
// of the srcs' numel, on their device) becomes alpha * [src0, src1, ...], each
// src flattened; with accumulate, dst += that instead. A plain copy (alpha 1,
// no accumulate) takes any floating dtype, the srcs' and dst's one. One op
// reading every src and writing dst. Throws weft::Error naming the op and the src whose
// device, dtype or size does not fit (or for no srcs).
void pack(const std::vector<Tensor>& srcs, Tensor& dst, float alpha = 1.0f, bool accumulate = false);
// The inverse: each dsts[k] becomes its run of `src` (the same layout as
// pack's). One op reading src and writing every dst; the dsts are distinct
// and contiguous.
void unpack(const Tensor& src, const std::vector<Tensor>& dsts);

// Rows [begin, end) of x (along dim 0) as a new tensor on x's device, in
// x's memory format.
Tensor slice_rows(const Tensor& x, std::int64_t begin, std::int64_t end);

// Axes reordered: out.shape[i] = x.shape[dims[i]], a new contiguous tensor
// (numpy.transpose / torch.permute(...).contiguous()). x contiguous, rank
// 1..6, any dtype; dims a permutation of [0, rank). Trace name "permute".
Tensor permute(const Tensor& x, std::vector<int> dims);

// Reductions.
Tensor sum(const Tensor& x);   // scalar (shape []), accumulated in double
Tensor mean(const Tensor& x);  // scalar; NaN for an empty tensor
Tensor argmax(const Tensor& x);  // x: [rows, cols] -> [rows], indices as float

// a: [m, k] (or [k, m] with trans_a), b: [k, n] (or [n, k] with trans_b) -> [m, n].
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// a [B, M, K] (or [B, K, M] when trans_a) x b [B, K, N] (or [B, N, K]) ->
// [B, M, N]: B matmuls in one op (cuBLAS strided-batched on GPUs). Its
// backward is two more: da = dc b^T, db = a^T dc.
Tensor batched_matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

}  // namespace weft::ops
