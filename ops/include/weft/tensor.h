// weft::Tensor — an n-d array on a device whose every operation is an engine op.
//
// A Tensor is a handle (cheap to copy; copies share the data) with a shape, a
// dtype, the device its memory lives on and one engine Var guarding that
// memory. Methods and the functions of weft/ops.h check their arguments at push
// time, throwing a weft::Error that names the op and the tensors ('name' [shape],
// with dtype and device where they matter), push one op and return at once;
// only to_host(), item() and wait_to_read() block. Devices: cpu(i) and gpu(i),
// and cpu_pinned(0), page-locked host memory whose ops run on cpu(0). A Tensor
// must not outlive its engine. Memory and dispatch: docs/design/tensors.md.
// A 4-D tensor's memory format says how its [N, C, H, W] values are stored:
// contiguous (NCHW) or channels_last (NHWC); the shape, to_host() and
// from_host() are always in NCHW order (docs/design/tensors.md, "Memory
// formats").
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weft/allocator.h"
#include "weft/device.h"
#include "weft/dtype.h"
#include "weft/engine.h"
#include "weft/shape.h"

namespace weft {

namespace detail {
struct Storage;
}

// How a tensor's values lie in memory. contiguous: row-major in the shape's
// order (NCHW for 4-D). channels_last: a 4-D [N, C, H, W] tensor stored as
// NHWC (PyTorch's torch.channels_last).
enum class MemoryFormat : std::uint8_t { contiguous, channels_last };
std::string_view to_string(MemoryFormat f) noexcept;

class Tensor {
 public:
  Tensor() = default;  // undefined: every use but defined() throws

  // ---- creation --------------------------------------------------------
  // empty() pushes nothing: the first op that writes the tensor allocates
  // its memory when it runs (so memory is taken no earlier than the work
  // that fills it). Each of the others pushes one op that writes it whole.
  static Tensor empty(Engine& engine, Shape shape, Device device = {}, DType dtype = DType::float32);
  static Tensor zeros(Engine& engine, Shape shape, Device device = {}, DType dtype = DType::float32);
  static Tensor ones(Engine& engine, Shape shape, Device device = {}, DType dtype = DType::float32);
  static Tensor full(Engine& engine, Shape shape, float value, Device device = {}, DType dtype = DType::float32);
  // Counter-based: element i is a function of (seed, i), equal on every device.
  static Tensor uniform(Engine& engine, Shape shape, float lo, float hi, std::uint64_t seed, Device device = {});
  static Tensor normal(Engine& engine, Shape shape, float mean, float stddev, std::uint64_t seed,
                       Device device = {});
  // Copies `data` at push time (it may be freed when this returns), rounded
  // to `dtype` (nearest even; weft/dtype.h).
  static Tensor from_host(Engine& engine, Shape shape, std::span<const float> data, Device device = {},
                          DType dtype = DType::float32);

  // ---- what it is -----------------------------------------------------
  bool defined() const noexcept { return storage_ != nullptr; }
  const Shape& shape() const;
  DType dtype() const;
  Device device() const;
  std::int64_t numel() const { return shape().numel(); }
  std::size_t nbytes() const;
  Var var() const;  // the engine variable guarding the storage
  Engine& engine() const;
  // contiguous unless an op made it channels_last (ops::to_memory_format,
  // and the ops that keep their input's format; weft/ops.h).
  MemoryFormat memory_format() const;
  std::string name() const;  // the Var's name, e.g. "conv1.weight"
  // Names the tensor and its Var: errors, traces, the dependency graph and the
  // profiler's table show it (see Engine::set_var_name).
  Tensor& set_name(std::string name);
  // What the memory holds, for the allocators' accounting by role and the
  // profiler's memory track (weft/allocator.h; default: activations).
  // Applies to the whole storage; any time, before or after allocation.
  Tensor& set_role(MemoryRole role);
  std::string str() const;   // "Tensor 'x' [256, 10] float32 on cpu(0)"

  // ---- blocking reads ---------------------------------------------------
  // Waits for the data and copies it out in the shape's (NCHW) order,
  // whatever the memory format (halves widened exactly).
  std::vector<float> to_host() const;
  float item() const;                  // numel() must be 1
  void wait_to_read() const;

  // ---- views and copies -------------------------------------------------
  // Same storage and Var, another shape with as many elements. A
  // channels_last tensor keeps its format for its own shape; another shape
  // is a weft::Error naming the tensor and its format (convert first:
  // ops::contiguous) unless NHWC and NCHW order its values alike (C == 1 or
  // H * W == 1), when the result is contiguous.
  Tensor reshape(Shape shape) const;
  // Elements [offset, offset + shape.numel()) of this tensor as a tensor of
  // `shape`: the same storage and Var, so ops on the view and on the whole
  // are ordered as ops on one tensor (a flat buffer whose parts are
  // parameters or gradients). Throws weft::InvalidArgument when the range
  // does not lie within this tensor, or for a channels_last tensor (as
  // reshape, but for the whole tensor in its own shape).
  Tensor view(std::int64_t offset, Shape shape) const;
  // The first element's position in the storage (0 unless a view).
  std::int64_t storage_offset() const;
  // Whether the two share memory: the same storage and overlapping elements.
  bool overlaps(const Tensor& other) const;
  // A new tensor on `device` with the same values and memory format. GPU
  // copies run on the copy workers (host<->GPU through pinned staging,
  // GPU<->GPU peer).
  Tensor copy_to(Device device) const;
  // Writes `src`'s values into this tensor (same shape, dtype and memory
  // format; any two devices; ops::cast and ops::to_memory_format convert).
  void copy_from(const Tensor& src);

  // ---- arithmetic (see weft/ops.h) -------------------------------------
  Tensor operator+(const Tensor& other) const;
  Tensor operator-(const Tensor& other) const;
  Tensor operator*(const Tensor& other) const;
  Tensor operator+(float s) const;
  Tensor operator*(float s) const;
  Tensor matmul(const Tensor& other) const;
  Tensor relu() const;
  Tensor sum() const;
  Tensor mean() const;

  // For the op layer: the shared storage.
  const std::shared_ptr<detail::Storage>& storage() const noexcept { return storage_; }
  static Tensor wrap(std::shared_ptr<detail::Storage> storage, Shape shape,
                     MemoryFormat format = MemoryFormat::contiguous);

 private:
  const detail::Storage& checked() const;
  std::shared_ptr<detail::Storage> storage_;
  Shape shape_;
  std::int64_t offset_ = 0;  // elements
  MemoryFormat format_ = MemoryFormat::contiguous;
};

// Memory of a device's allocator, for demos and benchmarks.
MemoryStats memory_stats(Engine& engine, Device device);

}  // namespace weft
