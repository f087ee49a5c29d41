// weft::OpProperty: which kind of worker an op needs. Its own header because
// the profiler (which classifies spans as compute or copy) needs it too.
#pragma once

#include <cstdint>
#include <string_view>

namespace weft {

// Which kind of worker an op needs (MXNet's FnProperty). On a GPU: compute
// workers (a pool of streams), one copy worker per direction with its own
// stream, and a worker on the device's highest-priority stream. On a CPU
// device copies run on the normal workers and `prioritized` ops go ahead of
// every other ready op.
enum class OpProperty : std::uint8_t {
  normal,
  copy_to_device,    // host -> GPU (the op's device is the GPU)
  copy_from_device,  // GPU -> host (the op's device is the GPU)
  copy_peer,         // GPU -> GPU, or between two host memories (the op's device is the destination)
  prioritized,
};
std::string_view to_string(OpProperty property) noexcept;

// Copies move data; everything else computes (the profiler's two classes).
constexpr bool is_copy(OpProperty property) noexcept {
  return property == OpProperty::copy_to_device || property == OpProperty::copy_from_device ||
         property == OpProperty::copy_peer;
}

}  // namespace weft
