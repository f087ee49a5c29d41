// weft::push_tensor_op — an op of your own on tensors: the extension point
// for kernels Weft does not have, and what parallel/ builds collectives on.
//   weft::push_tensor_op(Device::cpu(0), {x}, {y}, [n](weft::RunContext&, const weft::TensorData& d) {
//     for (std::int64_t i = 0; i < n; ++i) d.out(0)[i] = 2 * d.in(0)[i];
//   }, {.name = "double"});
// The op reads `inputs`, writes `outputs` (a tensor in both counts as written)
// and is ordered with every other op on them. Its body gets their memory, valid
// while it runs (async: until its Completion is called); an output nothing has
// written holds garbage. A CPU op touches host memory (cpu(i), cpu_pinned(0));
// a GPU op its own GPU's, enqueuing on ctx.gpu->stream and never waiting. An
// async CPU op may also hold GPU tensors: it gets their addresses to hand to
// ops it pushes on their GPUs, never to dereference, and completes once that
// work is done. At push time an undefined tensor, one of another engine or
// memory the device cannot touch is a weft::InvalidArgument naming the op and
// the tensor. With OpOptions::run_on_failed_input, a body called with
// ctx.failed_input set gets null pointers. How: docs/design/tensors.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "weft/engine.h"
#include "weft/tensor.h"
#include "weft/unique_function.h"

namespace weft {

// The memory of an op's tensors, in the order they were given.
struct TensorData {
  std::vector<void*> inputs, outputs;
  template <class T = float>
  const T* in(std::size_t k) const noexcept {
    return static_cast<const T*>(inputs[k]);
  }
  template <class T = float>
  T* out(std::size_t k) const noexcept {
    return static_cast<T*>(outputs[k]);
  }
};

using TensorOpFunction = UniqueFunction<void(RunContext&, const TensorData&)>;
using AsyncTensorOpFunction = UniqueFunction<void(RunContext&, const TensorData&, Completion)>;

void push_tensor_op(Device device, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                    TensorOpFunction body, OpOptions options = {});
// As push_tensor_op; the op completes when its Completion is called (CPU
// devices only, as Engine::push_async).
void push_tensor_op_async(Device device, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                          AsyncTensorOpFunction body, OpOptions options = {});

// ---- element work on raw memory, for op bodies ---------------------------
// float32, `n` elements of memory the op's device owns (outputs may alias
// inputs exactly). In a CPU op they run at once; in a GPU op they are
// enqueued on ctx.gpu->stream (a CUDA kernel; on a simulated GPU the CPU
// loop, run by that stream). Results are bit-identical across devices.
enum class Accumulate : unsigned char { sum, max };
// y[i] = y[i] + x[i]  (sum)  or  max(y[i], x[i])  (max).
void accumulate(RunContext& ctx, float* y, const float* x, std::int64_t n, Accumulate how);
// y[i] = y[i] * factor.
void scale(RunContext& ctx, float* y, float factor, std::int64_t n);

}  // namespace weft
