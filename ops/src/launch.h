// Pushing one tensor op: the op's closure keeps its storages alive until it has
// run, allocates its outputs on the worker (and stream) that runs it, tells
// the allocator which streams touched which blocks, and hands the kernel raw
// pointers.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "storage.h"
#include "weft/error.h"
#include "weft/tensor.h"

namespace weft::detail {

struct OpIO {
  std::vector<StoragePtr> in, out;
  const float* i(std::size_t k) const noexcept { return static_cast<const float*>(in[k]->data()); }
  float* o(std::size_t k) const noexcept { return static_cast<float*>(out[k]->data()); }
};

// Throws when `s` should hold data but has no memory.
void require_memory(const Storage& s, std::string_view op);

template <class Kernel>
void launch(std::string name, Device exec, std::vector<const Tensor*> inputs, std::vector<const Tensor*> outputs,
            Kernel kernel, OpProperty property = OpProperty::normal, std::uint64_t bytes = 0) {
  OpIO io;
  std::vector<Var> reads, writes;
  for (const Tensor* t : inputs) {
    if (!t->defined()) continue;
    io.in.push_back(t->storage());
    reads.push_back(t->var());
  }
  std::uint32_t creates = 0;  // bit k: this op creates output k
  for (const Tensor* t : outputs) {
    if (std::exchange(t->storage()->creator_pending, false)) creates |= 1u << io.out.size();
    io.out.push_back(t->storage());
    writes.push_back(t->var());
  }
  Engine& engine = outputs.empty() ? inputs.front()->engine() : outputs.front()->engine();
  engine.push(
      [io = std::move(io), creates, kernel = std::move(kernel)](RunContext& ctx) mutable {
        CUstream_st* stream = ctx.gpu ? ctx.gpu->stream : nullptr;
        for (std::size_t k = 0; k < io.out.size(); ++k) {
          if (creates & (1u << k))
            io.out[k]->materialize(stream);
          else
            require_memory(*io.out[k], ctx.op_name);
        }
        // A tensor whose creating op failed (out of memory, say) has no
        // memory: once that failure has been reported, ops reading it are no
        // longer skipped, and must not touch a null pointer.
        for (const StoragePtr& s : io.in) require_memory(*s, ctx.op_name);
        if (stream) {
          for (const StoragePtr& s : io.in) s->allocator->record_use(s->block, stream);
          for (const StoragePtr& s : io.out) s->allocator->record_use(s->block, stream);
        }
        kernel(ctx, io);
      },
      exec, reads, writes, OpOptions{0, std::move(name), property, bytes});
}

// Argument checks shared by the ops; each throws naming the op.
void check_defined(const char* op, const Tensor& t, const char* what);
void check_float32(const char* op, const Tensor& t, const char* what);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_same_shape(const char* op, const Tensor& a, const Tensor& b);
void check_rank(const char* op, const Tensor& t, std::size_t rank, const char* what);
// An uninitialized output on x's device.
Tensor make_like(const Tensor& x, Shape shape);

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
