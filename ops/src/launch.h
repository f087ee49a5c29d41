// Pushing one tensor op: the op's closure keeps its storages alive until it has
// run, allocates its outputs on the worker (and stream) that runs it, tells
// the allocator which streams touched which blocks, and hands the kernel raw
// pointers.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "describe.h"
#include "storage.h"
#include "weft/check_context.h"
#include "weft/error.h"
#include "weft/gpu_sim.h"
#include "weft/gpu_streams.h"
#include "weft/tensor.h"

namespace weft::detail {

// The innermost ops::PushScope of this thread: the priority and the name
// suffix of the ops it pushes (0 and "" outside any scope).
struct PushScopeState {
  int priority = 0;
  std::string label;
  bool tf32 = false;  // ops::AllowTf32
  Var after;          // read by every op as well (null: none)
  Var chain;          // written by every op as well (null: none)
  std::vector<Var> wait_for;  // ops::WaitFor: read by every op as well
};
const PushScopeState& current_push_scope() noexcept;

// What a kernel sees: the raw memory of its inputs and outputs. The op's
// closure keeps the storages alive until the op body has run; what the body
// enqueues on a GPU stream (kernels, or the CPU kernel on a simulated GPU)
// holds only these pointers, and the stream-aware allocator keeps the memory
// from other streams until that work is done — on CUDA and simulated GPUs alike.
//
// Element types: GPU branches get each tensor's dtype (in_types/out_types)
// and its raw memory. CPU branches (CPU devices, and every op on simulated
// GPUs) see float32 only: a half tensor reaches them widened into a float32
// copy, and each half output is rounded back (to nearest even) once the
// kernel returns; with `tf32`, float32 inputs reach them rounded to TF32's
// mantissa, as a TF32 tensor core reads them. So one float32 CPU kernel
// serves every precision, and takes the numerics of the GPU path.
struct OpIO {
  std::vector<void*> in, out;
  std::vector<DType> in_types, out_types;
  std::vector<std::size_t> in_bytes, out_bytes;
  const float* i(std::size_t k) const noexcept { return static_cast<const float*>(in[k]); }
  float* o(std::size_t k) const noexcept { return static_cast<float*>(out[k]); }
};

// Runs a CPU branch as the comment on OpIO says (widening halves, rounding
// to TF32 when asked); plain kernel(ctx, io) when there is nothing to convert.
void run_widened(RunContext& ctx, OpIO& io, bool tf32, const std::function<void(RunContext&, OpIO&)>& kernel);

// Throws when `s` should hold data but has no memory.
void require_memory(const Storage& s, std::string_view op);

// Where a tensor lies in its storage (a view lies inside a larger one).
struct TensorSpan {
  std::size_t offset = 0, bytes = 0;  // in bytes
  static TensorSpan of(const Tensor& t) {
    return {static_cast<std::size_t>(t.storage_offset()) * dtype_size(t.dtype()), t.nbytes()};
  }
  void* data(const Storage& s) const noexcept {
    return s.data() ? static_cast<unsigned char*>(s.data()) + offset : nullptr;
  }
};

// What an op tells the simulator's cost model beyond its tensors' bytes
// (weft/gpu_sim.h): the arithmetic of compute-bound ops (GEMMs,
// convolutions), and the bytes it moves where they differ from its inputs'
// and outputs' sizes. Elementwise ops give nothing: bandwidth-bound.
struct OpCost {
  double flops = 0;
  double bytes = 0;     // 0: every input read and every output written once
  double parallel = 0;  // independent outputs of a compute-bound kernel (GEMM M x N); 0: fills the GPU
};

// An op whose kernel is modeled on a simulated GPU: what the cost model and
// a cost table see (the op's name without its scope label; its operands'
// dtypes and shapes, as "float32[64,784];float32[784,10]->float32[64,10]",
// with "@tf32" for a GEMM or convolution under ops::AllowTf32).
struct ModeledOp {
  std::string op, shape;
  double flops = 0, bytes = 0, parallel = 0;
  gpu::Math math = gpu::Math::fp32;
  gpu::KernelCost cost() const { return gpu::KernelCost{op, shape, flops, bytes, math, parallel}; }
};
ModeledOp modeled_op(std::string op, const std::vector<const Tensor*>& inputs, const std::vector<const Tensor*>& outputs,
                     bool tf32, OpCost cost);

// The modeled mode's bookkeeping of values (Storage::no_values), on the
// worker before the op's kernel: a modeled op's outputs hold no values; a
// GPU op that computes or copies passes its inputs' mark on to its outputs
// (copies and collectives move undefined bytes, and what is computed from
// them is undefined too); a host op reading host memory that holds no
// values throws, naming the tensor and the mode, and clears its host
// outputs' mark (GPU tensors it holds for a collective's GPU work hold no
// values under the mode). Nothing is marked while the mode is off.
void track_values(const std::vector<StoragePtr>& in, const std::vector<StoragePtr>& out, const RunContext& ctx,
                  std::string_view op, bool modeled);
// Throws, for a host read `op` of `what` (a tensor's description), when `s` holds no values.
void require_values(const Storage& s, std::string_view op, const std::string& what);
// Whether one of `in` holds no values (track_values marks them).
inline bool reads_no_values(const std::vector<StoragePtr>& in) noexcept {
  for (const StoragePtr& s : in)
    if (s->no_values) return true;
  return false;
}

// How an op body meets a GPU.
enum class Body {
  // kernel(ctx, io) has a CPU branch (taken when ctx.gpu is null) and a GPU
  // branch. On CUDA the GPU branch enqueues its kernels on ctx.gpu->stream; on
  // simulated GPUs the CPU branch runs as stream-ordered work on that stream
  // (gpu::launch_host_kernel: a stream graph may run it again). This is the
  // one place in Weft outside devices/ that asks which GPU backend is active.
  kernels,
  // kernel(ctx, io) calls the stream API itself (gpu::memcpy_async, ...),
  // which every GPU backend implements: copies.
  stream_calls,
  // As kernels, but the CPU branch moves bytes of any dtype itself (host
  // copies): nothing is widened.
  bytes,
};

// The one dispatch point between CPU kernels, CUDA kernels and simulated
// GPUs. `modeled`: on a simulated GPU in the modeled mode, the kernel takes
// that op's modeled time instead of running.
template <class Kernel>
void run_kernel(RunContext& ctx, OpIO& io, Kernel& kernel, Body body, bool tf32, const ModeledOp* modeled = nullptr) {
  if (ctx.gpu && modeled && body != Body::stream_calls) {
    gpu::launch_modeled_kernel(ctx.gpu->stream, modeled->cost());
    return;
  }
  if (ctx.gpu && (body == Body::stream_calls || gpu::backend() != gpu::Backend::sim)) {
    kernel(ctx, io);
    return;
  }
  if (!ctx.gpu) {
    if (body == Body::bytes) kernel(ctx, io);
    else run_widened(ctx, io, tf32, [&kernel](RunContext& c, OpIO& o) { kernel(c, o); });
    return;
  }
  // The kernel is copied, not moved: a replayed op (Engine::replay) runs
  // this body again with the same kernel and its captured sizes.
  gpu::launch_host_kernel(
      ctx.gpu->stream, [io = std::move(io), kernel, device = ctx.device, worker = ctx.worker,
                        name = std::string(ctx.op_name), engine = ctx.engine, body, tf32]() mutable {
        CheckContextGuard check(name, device);
        RunContext host{device, worker, name, engine};  // gpu == null: the CPU branch
        if (body == Body::bytes) kernel(host, io);
        else run_widened(host, io, tf32, [&kernel](RunContext& c, OpIO& o) { kernel(c, o); });
      });
}

inline OpOptions scoped_options(std::string name, OpProperty property, std::uint64_t bytes) {
  const PushScopeState& scope = current_push_scope();
  if (!scope.label.empty()) name += " [" + scope.label + "]";
  return OpOptions{scope.priority, std::move(name), property, bytes};
}

// `tf32`: the op is a GEMM or convolution pushed under ops::AllowTf32 (its
// CPU branch then reads float32 inputs rounded to TF32). `cost`: for the
// simulator's modeled mode (OpCost).
template <class Kernel>
void launch(std::string name, Device exec, std::vector<const Tensor*> inputs, std::vector<const Tensor*> outputs,
            Kernel kernel, OpProperty property = OpProperty::normal, std::uint64_t bytes = 0,
            Body body = Body::kernels, bool tf32 = false, OpCost cost = {}) {
  // Whether the kernel is modeled is fixed at push time, with what the cost model needs.
  std::unique_ptr<ModeledOp> modeled;
  if (exec.is_gpu() && body != Body::stream_calls && gpu::kernels_modeled())
    modeled = std::make_unique<ModeledOp>(modeled_op(name, inputs, outputs, tf32, cost));
  std::vector<StoragePtr> in, out;
  std::vector<TensorSpan> in_spans, out_spans;  // each tensor's part of its storage (views)
  std::vector<Var> reads, writes;
  std::vector<bool> reads_unwritten;  // [k]: input k has no creating op yet (it may allocate it)
  for (const Tensor* t : inputs) {
    if (!t->defined()) continue;
    in.push_back(t->storage());
    in_spans.push_back(TensorSpan::of(*t));
    reads_unwritten.push_back(t->storage()->creator_pending);
    reads.push_back(t->var());
  }
  if (const Var after = current_push_scope().after; !after.is_null()) reads.push_back(after);
  for (const Var v : current_push_scope().wait_for) reads.push_back(v);
  for (const Tensor* t : outputs) {
    t->storage()->creator_pending = false;  // later readers find it written (or failed)
    out.push_back(t->storage());
    out_spans.push_back(TensorSpan::of(*t));
    writes.push_back(t->var());
  }
  if (const Var chain = current_push_scope().chain; !chain.is_null()) writes.push_back(chain);
  Engine& engine = outputs.empty() ? inputs.front()->engine() : outputs.front()->engine();
  OpOptions options = scoped_options(name, property, bytes);
  // While profiling, a GPU kernel's span carries its cost-table key, from
  // which a trace of a real run makes a cost table (docs/design/simulated-gpus.md).
  if (exec.is_gpu() && body != Body::stream_calls && engine.profiler().running())
    options.shape = modeled ? modeled->shape : modeled_op(name, inputs, outputs, tf32, cost).shape;
  engine.push(
      [in = std::move(in), out = std::move(out), in_spans = std::move(in_spans), out_spans = std::move(out_spans),
       reads_unwritten = std::move(reads_unwritten), kernel = std::move(kernel), body, tf32,
       modeled = std::shared_ptr<const ModeledOp>(std::move(modeled))](RunContext& ctx) mutable {
        gpu::Stream* stream = ctx.gpu ? ctx.gpu->stream : nullptr;
        for (std::size_t k = 0; k < in.size(); ++k)
          if (reads_unwritten[k]) in[k]->materialize_for_read(stream);
        // A tensor whose creating op failed (out of memory, say) has no
        // memory: once that failure has been reported, ops reading it are no
        // longer skipped, and must not touch a null pointer.
        for (const StoragePtr& s : in) require_memory(*s, ctx.op_name);
        // The creator allocates its outputs, and so does a later writer of
        // one whose creator failed (it writes it anew).
        for (const StoragePtr& s : out) s->materialize(stream);
        track_values(in, out, ctx, ctx.op_name, modeled != nullptr);
        OpIO io;
        io.in.reserve(in.size());
        io.out.reserve(out.size());
        for (std::size_t k = 0; k < in.size(); ++k) {
          io.in.push_back(in_spans[k].data(*in[k]));
          io.in_types.push_back(in[k]->dtype);
          io.in_bytes.push_back(in_spans[k].bytes);
        }
        for (std::size_t k = 0; k < out.size(); ++k) {
          io.out.push_back(out_spans[k].data(*out[k]));
          io.out_types.push_back(out[k]->dtype);
          io.out_bytes.push_back(out_spans[k].bytes);
        }
        if (stream) {
          for (const StoragePtr& s : in) s->allocator->record_use(s->block, stream);
          for (const StoragePtr& s : out) s->allocator->record_use(s->block, stream);
        }
        // A copy reading memory that holds no values writes none (its
        // outputs are marked above): the simulator times it and moves nothing.
        gpu::ScopedUndefinedBytes undefined_bytes(body == Body::stream_calls && stream && reads_no_values(in));
        run_kernel(ctx, io, kernel, body, tf32, modeled.get());
      },
      exec, reads, writes, std::move(options));
}

// Device memory a GPU branch needs for its own work (attention's scores),
// from the op's device's caching allocator on the op's stream, and freed when
// the branch returns: stream-ordered, so later work on the stream may reuse
// it and other streams only after it is done. Out of memory is the
// allocator's weft::OutOfMemory with `what` (the scratch, as "the [96, 1024,
// 1024] float32 scores") in front. The allocator refuses while a stream graph
// is captured, so such an op makes that capture fail and its segment run op
// by op (docs/design/capture-replay.md).
class GpuScratch {
 public:
  GpuScratch(const RunContext& ctx, std::size_t bytes, const std::string& what)
      : allocator_(&ctx.engine->allocator(ctx.device)), block_(allocate(bytes, ctx, what)) {}
  ~GpuScratch() { allocator_->free(block_); }
  GpuScratch(const GpuScratch&) = delete;
  GpuScratch& operator=(const GpuScratch&) = delete;
  float* floats() const noexcept { return static_cast<float*>(block_.ptr); }

 private:
  Block allocate(std::size_t bytes, const RunContext& ctx, const std::string& what) {
    try {
      return allocator_->allocate(bytes, ctx.gpu->stream);
    } catch (const OutOfMemory& e) {
      throw OutOfMemory(std::string(ctx.op_name) + ": " + what + ": " + e.what(), e.device(), e.requested(),
                        e.free_bytes());
    }
  }

  Allocator* allocator_;
  Block block_;
};

// Argument checks shared by the ops; each throws weft::InvalidArgument naming
// the op and the tensors (describe.h). `what` is the argument's role ("x", "dy").
void check_defined(const char* op, const Tensor& t, const char* what);
void check_float32(const char* op, const Tensor& t, const char* what);
// t is float32, bfloat16 or float16.
void check_floating(const char* op, const Tensor& t, const char* what);
// b has a's dtype: otherwise an InvalidArgument naming both tensors and dtypes.
void check_same_dtype(const char* op, const Tensor& a, const char* what_a, const Tensor& b, const char* what_b);
void check_same_engine(const char* op, const Tensor& a, const Tensor& b);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);  // and engine
void check_same_shape(const char* op, const Tensor& a, const Tensor& b);
void check_rank(const char* op, const Tensor& t, std::size_t rank, const char* what);
// An uninitialized output on x's device, of x's dtype (or `dtype`).
Tensor make_like(const Tensor& x, Shape shape);
Tensor make_like(const Tensor& x, Shape shape, DType dtype);
// The same in memory format `format` (channels_last: a 4-D shape).
Tensor make_like(const Tensor& x, Shape shape, DType dtype, MemoryFormat format);
// x in memory format `format`: x itself, or ops::to_memory_format's op.
Tensor as_format(const Tensor& x, MemoryFormat format);
// Throws for a channels_last `t`: the op `op` reads its memory in the
// shape's order (flat or rank-2 kernels), naming the tensor and its layout.
void check_not_channels_last(const char* op, const Tensor& t, const char* what);

[[noreturn]] void no_gpu_kernels(const char* op);

}  // namespace weft::detail

// The GPU branch of an op: the kernel where CUDA was built, else an error
// (unreachable in practice: without CUDA no GPU tensor can exist).
#if WEFT_HAVE_CUDA
#include "gpu/gpu_kernels.h"
#define WEFT_GPU_KERNEL(op, call) ::weft::kernels::gpu::call
#else
#define WEFT_GPU_KERNEL(op, call) ::weft::detail::no_gpu_kernels(op)
#endif
