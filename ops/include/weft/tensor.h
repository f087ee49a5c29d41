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
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
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
  std::vector<float> to_host() const;  // waits for the data, copies it out (halves widened exactly)
  float item() const;                  // numel() must be 1
  void wait_to_read() const;

  // ---- views and copies -------------------------------------------------
  // Same storage and Var, another shape with as many elements.
  Tensor reshape(Shape shape) const;
  // Elements [offset, offset + shape.numel()) of this tensor as a tensor of
  // `shape`: the same storage and Var, so ops on the view and on the whole
  // are ordered as ops on one tensor (a flat buffer whose parts are
  // parameters or gradients). Throws weft::InvalidArgument when the range
  // does not lie within this tensor.
  Tensor view(std::int64_t offset, Shape shape) const;
  // The first element's position in the storage (0 unless a view).
  std::int64_t storage_offset() const;
  // Whether the two share memory: the same storage and overlapping elements.
  bool overlaps(const Tensor& other) const;
  // A new tensor on `device` with the same values. GPU copies run on the
  // copy workers (host<->GPU through pinned staging, GPU<->GPU peer).
  Tensor copy_to(Device device) const;
  // Writes `src`'s values into this tensor (same shape and dtype; any two
  // devices; ops::cast converts).
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
  static Tensor wrap(std::shared_ptr<detail::Storage> storage, Shape shape);

 private:
  const detail::Storage& checked() const;
  std::shared_ptr<detail::Storage> storage_;
  Shape shape_;
  std::int64_t offset_ = 0;  // elements
};

// Memory of a device's allocator, for demos and benchmarks.
MemoryStats memory_stats(Engine& engine, Device device);

}  // namespace weft
