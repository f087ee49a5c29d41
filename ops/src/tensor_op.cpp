#include "weft/tensor_op.h"

#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "cpu/cpu_kernels.h"
#include "describe.h"
#include "launch.h"
#include "storage.h"
#include "weft/error.h"

namespace weft {
namespace {

using detail::StoragePtr;

// What the op's closure keeps: the storages (alive until the op is done)
// and which inputs no op has written yet.
struct Bound {
  std::vector<StoragePtr> in, out;
  std::vector<detail::TensorSpan> in_spans, out_spans;  // views: their part of the storage
  std::vector<bool> reads_unwritten;  // [k]: input k has no creating op yet (it may allocate it)
  std::vector<Var> reads, writes;
  Engine* engine = nullptr;
};

// `holds`: an async op on a CPU device may hold GPU tensors (their addresses
// go to GPU ops it pushes; see tensor_op.h).
Bound bind_tensors(const char* call, Device device, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                   const std::string& name, bool holds) {
  Bound b;
  const std::string op = std::string(call) + " (op '" + name + "')";
  auto check = [&](const Tensor& t, const char* role, std::size_t k) {
    const std::string which = std::string(role) + " " + std::to_string(k);
    if (!t.defined()) throw InvalidArgument(op + ": " + which + " is an undefined Tensor");
    if (b.engine && &t.engine() != b.engine)
      throw InvalidArgument(op + ": " + which + " " + detail::describe_on(t) +
                            " belongs to another engine than the op's other tensors");
    b.engine = &t.engine();
    const Device memory = t.device();
    const bool reachable = device.is_gpu() ? memory == device : (!memory.is_gpu() || holds);
    if (!reachable)
      throw InvalidArgument(op + " on " + device.str() + ": cannot touch " + which + " " + detail::describe_on(t) +
                            (device.is_gpu() ? " (a GPU op touches its own GPU's memory)"
                                             : " (a CPU op touches host memory only; an async one may hold GPU tensors)"));
  };
  for (std::size_t k = 0; k < inputs.size(); ++k) check(inputs[k], "input", k);
  for (std::size_t k = 0; k < outputs.size(); ++k) check(outputs[k], "output", k);
  if (!b.engine) throw InvalidArgument(op + ": no tensors (push a plain engine op instead)");
  for (const Tensor& t : inputs) {
    b.in.push_back(t.storage());
    b.in_spans.push_back(detail::TensorSpan::of(t));
    b.reads_unwritten.push_back(t.storage()->creator_pending);
    b.reads.push_back(t.var());
  }
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    outputs[k].storage()->creator_pending = false;  // later readers find it written (or failed)
    b.out.push_back(outputs[k].storage());
    b.out_spans.push_back(detail::TensorSpan::of(outputs[k]));
    b.writes.push_back(outputs[k].var());
  }
  return b;
}

// On the worker: allocate what this op creates, check the rest has memory,
// tell the allocator which stream uses what, and collect the pointers.
TensorData materialize(const Bound& b, RunContext& ctx) {
  TensorData d;
  if (ctx.failed_input) {  // run_on_failed_input: an input has no valid data, maybe no memory
    d.inputs.assign(b.in.size(), nullptr);
    d.outputs.assign(b.out.size(), nullptr);
    return d;
  }
  // A CPU op holding GPU tensors allocates them for no stream (nullptr): the
  // GPU work it hands them to is done before it completes.
  gpu::Stream* stream = ctx.gpu ? ctx.gpu->stream : nullptr;
  for (std::size_t k = 0; k < b.in.size(); ++k)
    if (b.reads_unwritten[k]) b.in[k]->materialize_for_read(stream);
  for (const StoragePtr& s : b.in) detail::require_memory(*s, ctx.op_name);
  // The creator allocates its outputs, and so does a later writer of one
  // whose creator failed (it writes it anew).
  for (const StoragePtr& s : b.out) s->materialize(stream);
  // A GPU op of its own under the modeled mode may run modeled kernels
  // (accumulate, scale): its outputs are taken to hold no values.
  detail::track_values(b.in, b.out, ctx, ctx.op_name, ctx.gpu && gpu::kernels_modeled());
  for (std::size_t k = 0; k < b.in.size(); ++k) d.inputs.push_back(b.in_spans[k].data(*b.in[k]));
  for (std::size_t k = 0; k < b.out.size(); ++k) d.outputs.push_back(b.out_spans[k].data(*b.out[k]));
  if (stream) {
    for (const StoragePtr& s : b.in) s->allocator->record_use(s->block, stream);
    for (const StoragePtr& s : b.out) s->allocator->record_use(s->block, stream);
  }
  return d;
}

// The Completion an async tensor op's body gets: it forwards to the
// engine's and keeps the tensors' storages alive until it is called (the
// engine destroys an async op's function when the body returns, which may be
// long before the op completes), and not a moment longer.
class HoldingCompletion final : public detail::CompletionTarget {
 public:
  HoldingCompletion(Completion inner, std::shared_ptr<Bound> bound)
      : inner_(std::move(inner)), bound_(std::move(bound)) {}
  void completion_retain() noexcept override { refs_.fetch_add(1, std::memory_order_relaxed); }
  void completion_release() noexcept override {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;  // inner_ fails the op if never called
  }
  void completion_call(std::exception_ptr error) override {
    if (called_.exchange(true, std::memory_order_acq_rel)) {
      inner_(std::move(error));  // the engine's completion says "called twice"
      return;
    }
    // The tensors go first: once the engine's completion returns, a waiter
    // may have seen the op complete and destroyed the engine (and with it
    // the allocators that take the tensors' memory back).
    bound_.reset();
    inner_(std::move(error));
  }

 private:
  ~HoldingCompletion() = default;
  Completion inner_;
  std::shared_ptr<Bound> bound_;
  std::atomic<int> refs_{1};
  std::atomic<bool> called_{false};
};

}  // namespace

void push_tensor_op(Device device, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                    TensorOpFunction body, OpOptions options) {
  if (!body) throw InvalidArgument("push_tensor_op (op '" + options.name + "'): the body is empty");
  Bound b = bind_tensors("push_tensor_op", device, inputs, outputs, options.name, false);
  Engine& engine = *b.engine;
  const std::vector<Var> reads = std::move(b.reads), writes = std::move(b.writes);
  engine.push(
      [b = std::move(b), body = std::move(body)](RunContext& ctx) mutable {
        const TensorData d = materialize(b, ctx);
        body(ctx, d);
      },
      device, reads, writes, std::move(options));
}

void push_tensor_op_async(Device device, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                          AsyncTensorOpFunction body, OpOptions options) {
  if (!body) throw InvalidArgument("push_tensor_op_async (op '" + options.name + "'): the body is empty");
  Bound b = bind_tensors("push_tensor_op_async", device, inputs, outputs, options.name, !device.is_gpu());
  Engine& engine = *b.engine;
  const std::vector<Var> reads = std::move(b.reads), writes = std::move(b.writes);
  engine.push_async(
      [b = std::make_shared<Bound>(std::move(b)), body = std::move(body)](RunContext& ctx, Completion done) mutable {
        const TensorData d = materialize(*b, ctx);
        body(ctx, d, Completion(new HoldingCompletion(std::move(done), std::move(b))));
      },
      device, reads, writes, std::move(options));
}

// ---- element work for op bodies -------------------------------------------

namespace {
// accumulate and scale on a simulated GPU in the modeled mode: `bytes` moved.
bool modeled_element_work(RunContext& ctx, const char* op, std::int64_t n, double bytes) {
  if (!ctx.gpu || !gpu::kernels_modeled()) return false;
  const std::string shape = "float32[" + std::to_string(n) + "]";
  gpu::launch_modeled_kernel(ctx.gpu->stream, gpu::KernelCost{op, shape, 0, bytes, gpu::Math::fp32});
  return true;
}
}  // namespace

void accumulate(RunContext& ctx, float* y, const float* x, std::int64_t n, Accumulate how) {
  if (n <= 0) return;
  if (modeled_element_work(ctx, how == Accumulate::max ? "accumulate max" : "accumulate", n,
                           12.0 * static_cast<double>(n)))
    return;
  detail::OpIO io;
  auto kernel = [y, x, n, how](RunContext& c, detail::OpIO&) {
    if (!c.gpu) {
      if (how == Accumulate::max) kernels::cpu::maximum(y, y, x, n);
      else kernels::cpu::add(y, y, x, n);
    } else if (how == Accumulate::max) {
      WEFT_GPU_KERNEL("accumulate", maximum(*c.gpu, DType::float32, y, y, x, n));
    } else {
      WEFT_GPU_KERNEL("accumulate", add(*c.gpu, DType::float32, y, y, x, n));
    }
  };
  detail::run_kernel(ctx, io, kernel, detail::Body::kernels, false);
}

void scale(RunContext& ctx, float* y, float factor, std::int64_t n) {
  if (n <= 0) return;
  if (modeled_element_work(ctx, "scale", n, 8.0 * static_cast<double>(n))) return;
  detail::OpIO io;
  auto kernel = [y, factor, n](RunContext& c, detail::OpIO&) {
    if (!c.gpu) kernels::cpu::mul_scalar(y, y, factor, n);
    else WEFT_GPU_KERNEL("scale", mul_scalar(*c.gpu, DType::float32, y, y, factor, n));
  };
  detail::run_kernel(ctx, io, kernel, detail::Body::kernels, false);
}

}  // namespace weft
