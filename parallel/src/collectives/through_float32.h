// Half-precision collectives that a transport runs in float32 (internal to
// parallel/): float32 copies of the members' bfloat16 or float16 tensors,
// the float32 collective on them, and its results rounded once into the
// tensors. Every step is an op pushed on the members' devices (ops::cast
// and a copy), ordered by the tensors it shares with the next: no host
// waits, and a failed input reaches every member as in the float32 form.
// docs/design/parallel-collectives.md, "Half precision".
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "weft/gpu_sim.h"
#include "weft/gpu_streams.h"
#include "weft/ops.h"
#include "weft/tensor.h"
#include "weft/tensor_op.h"

namespace weft::parallel::detail {

// Exact float32 copies of `tensors`, on their devices.
inline std::vector<Tensor> widened(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> wide;
  wide.reserve(tensors.size());
  for (const Tensor& t : tensors) wide.push_back(ops::cast(t, DType::float32));
  return wide;
}

// dst[k] (bfloat16 or float16) = wide[k] rounded to nearest even; same
// device, same element count.
inline void narrow_into(const std::vector<Tensor>& dst, const std::vector<Tensor>& wide, const std::string& name,
                        int priority) {
  for (std::size_t k = 0; k < dst.size(); ++k) {
    Tensor rounded = ops::cast(wide[k], dst[k].dtype());
    push_tensor_op(
        dst[k].device(), {rounded}, {dst[k]},
        [bytes = dst[k].nbytes()](RunContext& ctx, const TensorData& d) {
          if (bytes == 0) return;
          if (ctx.gpu) {
            // A collective's GPU tensors hold no values under the modeled mode.
            gpu::ScopedUndefinedBytes undefined_bytes(gpu::kernels_modeled());
            gpu::memcpy_async(d.outputs[0], d.inputs[0], bytes, gpu::CopyKind::device_to_device, ctx.gpu->stream);
          } else {
            std::memcpy(d.outputs[0], d.inputs[0], bytes);
          }
        },
        {.priority = priority, .name = name + " rounded"});
  }
}

}  // namespace weft::parallel::detail
