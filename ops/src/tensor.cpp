#include "weft/tensor.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "cpu/cpu_kernels.h"
#include "launch.h"
#include "weft/ops.h"

namespace weft {

using detail::exec_device;
using detail::launch;
using detail::OpIO;
using detail::Storage;
using detail::StoragePtr;

namespace detail {

namespace {
thread_local PushScopeState push_scope;
}

const PushScopeState& current_push_scope() noexcept { return push_scope; }

Storage::~Storage() {
  if (block) allocator->free(block);
  try {
    engine->delete_var(var);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft: freeing a tensor: %s\n", e.what());
  }
}

void require_memory(const Storage& s, std::string_view op) {
  if (s.bytes && !s.block)
    throw Error("op '" + std::string(op) + "': its tensor" + (s.name.empty() ? "" : " '" + s.name + "'") + " on " +
                s.device.str() + " (" + std::to_string(s.bytes) +
                " bytes) has no memory: the op that should have created it failed");
}

namespace {
void append_operand(std::string& key, const Tensor& t) {
  key += to_string(t.dtype());
  key += '[';
  const std::vector<std::int64_t>& dims = t.shape().dims();
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i) key += ',';
    key += std::to_string(dims[i]);
  }
  key += ']';
}
}  // namespace

ModeledOp modeled_op(std::string op, const std::vector<const Tensor*>& inputs, const std::vector<const Tensor*>& outputs,
                     bool tf32, OpCost cost) {
  ModeledOp m;
  m.op = std::move(op);
  m.flops = cost.flops;
  m.parallel = cost.parallel;
  double bytes = 0;
  bool first = true, bf16 = false, fp16 = false;
  for (const Tensor* t : inputs) {
    if (!t->defined()) continue;
    if (!first) m.shape += ';';
    first = false;
    append_operand(m.shape, *t);
    bytes += static_cast<double>(t->nbytes());
    bf16 |= t->dtype() == DType::bfloat16;
    fp16 |= t->dtype() == DType::float16;
  }
  m.shape += "->";
  first = true;
  for (const Tensor* t : outputs) {
    if (!first) m.shape += ';';
    first = false;
    append_operand(m.shape, *t);
    bytes += static_cast<double>(t->nbytes());
    if (inputs.empty()) {
      bf16 |= t->dtype() == DType::bfloat16;
      fp16 |= t->dtype() == DType::float16;
    }
  }
  if (tf32) m.shape += "@tf32";
  m.bytes = cost.bytes > 0 ? cost.bytes : bytes;
  m.math = bf16 ? gpu::Math::bf16 : fp16 ? gpu::Math::fp16 : tf32 ? gpu::Math::tf32 : gpu::Math::fp32;
  return m;
}

void require_values(const Storage& s, std::string_view op, const std::string& what) {
  if (!s.no_values) return;
  const std::string model = gpu::kernels_modeled() ? "WEFT_SIM_MODEL=" + gpu::sim_model().model : "WEFT_SIM_MODEL";
  throw Error("op '" + std::string(op) + "': tensor " + what + " holds no values: they come from " + *s.no_values +
              ", a kernel the simulated GPUs modeled without computing it (" + model +
              ": modeled kernels take time, not values)");
}

void track_values(const std::vector<StoragePtr>& in, const std::vector<StoragePtr>& out, const RunContext& ctx,
                  std::string_view op, bool modeled) {
  if (modeled) {
    auto origin = std::make_shared<const std::string>("'" + std::string(op) + "' on " + ctx.device.str());
    for (const StoragePtr& s : out) s->no_values = origin;
    return;
  }
  if (ctx.gpu) {
    std::shared_ptr<const std::string> mark;
    for (const StoragePtr& s : in)
      if (s->no_values) {
        mark = s->no_values;
        break;
      }
    for (const StoragePtr& s : out) s->no_values = mark;
    return;
  }
  for (const StoragePtr& s : in) {
    if (s->no_values && !s->device.is_gpu()) {
      const std::string what = (s->name.empty() ? std::string() : "'" + s->name + "' ") + "on " + s->device.str() +
                               " (" + std::to_string(s->bytes) + " bytes)";
      require_values(*s, op, what);
    }
  }
  // A host op holding GPU tensors (a collective's hold op) hands them to GPU
  // work that may run modeled kernels: under the mode they hold no values.
  std::shared_ptr<const std::string> held;
  if (gpu::kernels_modeled()) {
    for (const StoragePtr& s : in)
      if (s->no_values) held = s->no_values;
    if (!held) held = std::make_shared<const std::string>("'" + std::string(op) + "' (GPU tensors it holds)");
  }
  for (const StoragePtr& s : out) {
    if (!s->device.is_gpu()) s->no_values = nullptr;
    else if (held) s->no_values = held;
  }
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "(none)";
  const std::string& name = t.storage()->name;
  return (name.empty() ? std::string() : "'" + name + "' ") + t.shape().str() +
         (t.memory_format() == MemoryFormat::channels_last ? " channels_last" : "");
}

std::string describe_on(const Tensor& t) {
  if (!t.defined()) return "(none)";
  return describe(t) + " " + std::string(to_string(t.dtype())) + " on " + t.device().str();
}

void check_defined(const char* op, const Tensor& t, const char* what) {
  if (!t.defined()) throw InvalidArgument(std::string(op) + ": " + what + " is an undefined Tensor");
}

void check_float32(const char* op, const Tensor& t, const char* what) {
  check_defined(op, t, what);
  if (t.dtype() != DType::float32)
    throw InvalidArgument(std::string(op) + ": " + what + " " + describe(t) + " on " + t.device().str() +
                          " has dtype " + std::string(to_string(t.dtype())) + "; this op supports float32 only");
}

void check_floating(const char* op, const Tensor& t, const char* what) {
  check_defined(op, t, what);
  if (!has_kernels(t.dtype()))
    throw InvalidArgument(std::string(op) + ": " + what + " " + describe(t) + " on " + t.device().str() +
                          " has dtype " + std::string(to_string(t.dtype())) +
                          "; this op supports float32, bfloat16 and float16");
}

void check_same_dtype(const char* op, const Tensor& a, const char* what_a, const Tensor& b, const char* what_b) {
  if (a.dtype() != b.dtype())
    throw InvalidArgument(std::string(op) + ": " + what_a + " " + describe(a) + " is " +
                          std::string(to_string(a.dtype())) + " but " + what_b + " " + describe(b) + " is " +
                          std::string(to_string(b.dtype())) + " (cast one of them first: ops::cast)");
}

void run_widened(RunContext& ctx, OpIO& io, bool tf32, const std::function<void(RunContext&, OpIO&)>& kernel) {
  bool convert = false;
  for (DType t : io.in_types) convert |= is_half(t) || (tf32 && t == DType::float32);
  for (DType t : io.out_types) convert |= is_half(t);
  if (!convert) {
    kernel(ctx, io);
    return;
  }
  OpIO wide = io;
  std::vector<std::unique_ptr<float[]>> buffers;  // uninitialized: each is written whole first
  buffers.reserve(io.in.size() + io.out.size());
  auto widened = [&](void* data, DType t, std::size_t bytes) {
    const auto n = static_cast<std::int64_t>(bytes / dtype_size(t));
    float* b = buffers.emplace_back(new float[static_cast<std::size_t>(n)]).get();
    if (t == DType::float32) kernels::cpu::round_to_tf32(b, static_cast<const float*>(data), n);
    else kernels::cpu::cast(b, DType::float32, data, t, n);
    return static_cast<void*>(b);
  };
  for (std::size_t k = 0; k < io.in.size(); ++k) {
    const DType t = io.in_types[k];
    if (io.in[k] && (is_half(t) || (tf32 && t == DType::float32))) {
      wide.in[k] = widened(io.in[k], t, io.in_bytes[k]);
      wide.in_types[k] = DType::float32;
    }
  }
  // Outputs are widened from their contents: an op may update one in place.
  std::vector<std::size_t> narrowed;
  for (std::size_t k = 0; k < io.out.size(); ++k) {
    if (io.out[k] && is_half(io.out_types[k])) {
      wide.out[k] = widened(io.out[k], io.out_types[k], io.out_bytes[k]);
      wide.out_types[k] = DType::float32;
      narrowed.push_back(k);
    }
  }
  kernel(ctx, wide);
  for (std::size_t k : narrowed)
    kernels::cpu::cast(io.out[k], io.out_types[k], wide.out[k], DType::float32,
                       static_cast<std::int64_t>(io.out_bytes[k] / dtype_size(io.out_types[k])));
}

void check_same_engine(const char* op, const Tensor& a, const Tensor& b) {
  if (&a.engine() != &b.engine())
    throw InvalidArgument(std::string(op) + ": " + describe(a) + " and " + describe(b) +
                          " belong to different engines");
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  if (a.device() != b.device())
    throw InvalidArgument(std::string(op) + ": operands on different devices: " + describe_on(a) + " and " +
                          describe_on(b) + " (copy_to one of them first)");
  check_same_engine(op, a, b);
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    throw InvalidArgument(std::string(op) + ": shapes differ: " + describe(a) + " vs " + describe(b));
}

void check_rank(const char* op, const Tensor& t, std::size_t rank, const char* what) {
  if (t.shape().rank() != rank)
    throw InvalidArgument(std::string(op) + ": " + what + " must have rank " + std::to_string(rank) + ", got " +
                          describe(t));
}

// An op's output: no op of its own. The op that first writes it allocates it
// when it runs (launch.h), so outputs of ops queued far ahead take no memory
// until their producers run, and creating one costs no engine op.
Tensor make_like(const Tensor& x, Shape shape) { return make_like(x, std::move(shape), x.dtype()); }

Tensor make_like(const Tensor& x, Shape shape, DType dtype) {
  return make_like(x, std::move(shape), dtype, MemoryFormat::contiguous);
}

Tensor make_like(const Tensor& x, Shape shape, DType dtype, MemoryFormat format) {
  const auto bytes = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
  return Tensor::wrap(std::make_shared<Storage>(x.engine(), x.device(), dtype, bytes, ""), std::move(shape), format);
}

void no_gpu_kernels(const char* op) {
  throw Error(std::string(op) + ": this Weft was built without CUDA, it has no GPU kernels");
}

}  // namespace detail

namespace {

// `source`: the tensor a copy_to would copy (named in the message), or null.
void check_device(Engine& engine, Device device, const char* op, const Tensor* source = nullptr) {
  const std::string what = std::string(op) + ": " +
                           (source ? "cannot copy " + detail::describe(*source) + " to " : "device ") + device.str();
  if (device.kind() == DeviceKind::cpu_pinned) {
    if (device.index() != 0) throw InvalidArgument(what + ": only cpu_pinned(0) exists");
    return;
  }
  for (Device d : engine.devices())
    if (d == device) return;
  std::string have;
  for (Device d : engine.devices()) have += (have.empty() ? "" : ", ") + d.str();
  throw InvalidArgument(what + ": not one of this engine's devices (" + have + ", cpu_pinned(0))");
}

// A fresh tensor whose creating op is `kernel` (it writes the whole tensor).
// The CPU branch writes float32 (run_widened rounds it for a half tensor).
template <class CpuFill, class GpuFill>
Tensor create(Engine& engine, Shape shape, Device device, DType dtype, const char* op, CpuFill cpu, GpuFill gpu) {
  check_device(engine, device, op);
  if (!has_kernels(dtype))
    throw InvalidArgument(std::string(op) + ": dtype " + std::string(to_string(dtype)) +
                          " has no kernels (float32, bfloat16 and float16 do)");
  auto storage = std::make_shared<Storage>(engine, device, dtype,
                                           static_cast<std::size_t>(shape.numel()) * dtype_size(dtype), "");
  Tensor t = Tensor::wrap(std::move(storage), std::move(shape));
  const std::int64_t n = t.numel();
  launch(op, exec_device(device), {}, {&t}, [n, cpu, gpu, dtype](RunContext& ctx, OpIO& io) {
    if (ctx.gpu)
      gpu(*ctx.gpu, dtype, io.out[0], n);
    else
      cpu(io.o(0), n);
  });
  return t;
}

}  // namespace

Tensor Tensor::wrap(std::shared_ptr<Storage> storage, Shape shape, MemoryFormat format) {
  if (format == MemoryFormat::channels_last && shape.rank() != 4)
    throw InvalidArgument("channels_last: a tensor of shape " + shape.str() +
                          " cannot be channels_last (only 4-D [N, C, H, W] tensors can)");
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = std::move(shape);
  t.format_ = format;
  return t;
}

std::string_view to_string(MemoryFormat f) noexcept {
  return f == MemoryFormat::channels_last ? "channels_last" : "contiguous";
}

MemoryFormat Tensor::memory_format() const {
  checked();
  return format_;
}

Tensor Tensor::empty(Engine& engine, Shape shape, Device device, DType dtype) {
  check_device(engine, device, "empty");
  const auto bytes = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
  return wrap(std::make_shared<Storage>(engine, device, dtype, bytes, ""), std::move(shape));
}

Tensor Tensor::full(Engine& engine, Shape shape, float value, Device device, DType dtype) {
  return create(
      engine, std::move(shape), device, dtype, "full",
      [value](float* y, std::int64_t n) { kernels::cpu::fill(y, n, value); },
      [value](const gpu::WorkerHandles& h, DType t, void* y, std::int64_t n) {
        (void)h, (void)t, (void)y, (void)n;
        WEFT_GPU_KERNEL("full", fill(h, t, y, n, value));
      });
}

Tensor Tensor::zeros(Engine& engine, Shape shape, Device device, DType dtype) {
  return full(engine, std::move(shape), 0.0f, device, dtype);
}

Tensor Tensor::ones(Engine& engine, Shape shape, Device device, DType dtype) {
  return full(engine, std::move(shape), 1.0f, device, dtype);
}

Tensor Tensor::uniform(Engine& engine, Shape shape, float lo, float hi, std::uint64_t seed, Device device) {
  if (!(lo <= hi)) throw Error("uniform: lo " + std::to_string(lo) + " > hi " + std::to_string(hi));
  return create(
      engine, std::move(shape), device, DType::float32, "uniform",
      [=](float* y, std::int64_t n) { kernels::cpu::uniform(y, n, lo, hi, seed); },
      [=](const gpu::WorkerHandles& h, DType, void* y, std::int64_t n) {
        (void)h, (void)y, (void)n;
        WEFT_GPU_KERNEL("uniform", uniform(h, static_cast<float*>(y), n, lo, hi, seed));
      });
}

Tensor Tensor::normal(Engine& engine, Shape shape, float mean, float stddev, std::uint64_t seed, Device device) {
  if (!(stddev >= 0)) throw Error("normal: stddev " + std::to_string(stddev) + " is negative");
  return create(
      engine, std::move(shape), device, DType::float32, "normal",
      [=](float* y, std::int64_t n) { kernels::cpu::normal(y, n, mean, stddev, seed); },
      [=](const gpu::WorkerHandles& h, DType, void* y, std::int64_t n) {
        (void)h, (void)y, (void)n;
        WEFT_GPU_KERNEL("normal", normal(h, static_cast<float*>(y), n, mean, stddev, seed));
      });
}

Tensor Tensor::from_host(Engine& engine, Shape shape, std::span<const float> data, Device device, DType dtype) {
  if (static_cast<std::int64_t>(data.size()) != shape.numel())
    throw Error("from_host: " + std::to_string(data.size()) + " values given for shape " + shape.str() + " (" +
                std::to_string(shape.numel()) + " elements)");
  if (!has_kernels(dtype))
    throw InvalidArgument("from_host: dtype " + std::string(to_string(dtype)) +
                          " is not float32, bfloat16 or float16");
  if (device.is_gpu())
    return from_host(engine, std::move(shape), data, Device::cpu_pinned(0), dtype).copy_to(device);
  check_device(engine, device, "from_host");
  // Converted at push time (the caller may free `data` when this returns).
  std::vector<unsigned char> bytes(data.size() * dtype_size(dtype));
  kernels::cpu::cast(bytes.data(), dtype, data.data(), DType::float32, static_cast<std::int64_t>(data.size()));
  auto storage = std::make_shared<Storage>(engine, device, dtype, bytes.size(), "");
  Tensor t = wrap(std::move(storage), std::move(shape));
  launch("from_host", exec_device(device), {}, {&t}, [bytes = std::move(bytes)](RunContext&, OpIO& io) {
    if (!bytes.empty()) std::memcpy(io.out[0], bytes.data(), bytes.size());
  }, OpProperty::normal, 0, detail::Body::bytes);
  return t;
}

const Storage& Tensor::checked() const {
  if (!storage_) throw Error("use of an undefined weft::Tensor");
  return *storage_;
}
const Shape& Tensor::shape() const {
  checked();
  return shape_;
}
DType Tensor::dtype() const { return checked().dtype; }
Device Tensor::device() const { return checked().device; }
std::size_t Tensor::nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
Var Tensor::var() const { return checked().var; }
Engine& Tensor::engine() const { return *checked().engine; }
std::string Tensor::name() const { return storage_ ? storage_->name : std::string(); }

Tensor& Tensor::set_name(std::string name) {
  checked();
  storage_->engine->set_var_name(storage_->var, name);  // for the engine's messages, traces and tables
  storage_->name = std::move(name);
  return *this;
}

Tensor& Tensor::set_role(MemoryRole role) {
  checked();
  storage_->set_role(role);
  return *this;
}

std::string Tensor::str() const {
  if (!storage_) return "Tensor (undefined)";
  return "Tensor " + detail::describe_on(*this);
}

void Tensor::wait_to_read() const { engine().wait_to_read(var()); }

std::vector<float> Tensor::to_host() const {
  detail::check_floating("to_host", *this, "tensor");
  if (device().is_gpu()) {
    const Tensor staged = copy_to(Device::cpu_pinned(0));
    staged.wait_to_read();
    detail::require_values(*staged.storage_, "to_host", detail::describe_on(*this));
    return staged.to_host();
  }
  wait_to_read();
  if (storage_->creator_pending) storage_->materialize_for_read(nullptr);  // never written: uninitialized
  detail::require_memory(*storage_, "to_host");
  detail::require_values(*storage_, "to_host", detail::describe_on(*this));
  std::vector<float> out(static_cast<std::size_t>(numel()));
  if (!out.empty())
    kernels::cpu::cast(out.data(), DType::float32,
                       static_cast<const unsigned char*>(storage_->data()) + offset_ * dtype_size(dtype()), dtype(),
                       numel());
  if (format_ == MemoryFormat::channels_last && !out.empty()) {  // NHWC memory -> NCHW order
    std::vector<float> nchw(out.size());
    kernels::cpu::to_channels_first(nchw.data(), out.data(), shape_[0], shape_[1], shape_[2] * shape_[3],
                                    sizeof(float));
    return nchw;
  }
  return out;
}

float Tensor::item() const {
  if (numel() != 1)
    throw Error("item: " + detail::describe(*this) + " has " + std::to_string(numel()) + " elements, not 1");
  return to_host()[0];
}

namespace {
// Whether a channels_last tensor's memory holds its values in NCHW order too
// (one channel, or one position per image), so a view of it reinterprets nothing.
bool nchw_order_too(const Shape& s) { return s.rank() == 4 && (s[1] == 1 || s[2] * s[3] == 1); }
}  // namespace

Tensor Tensor::reshape(Shape shape) const {
  if (shape.numel() != numel())
    throw Error("reshape: " + detail::describe(*this) + " cannot become " + shape.str() + " (" +
                std::to_string(numel()) + " vs " + std::to_string(shape.numel()) + " elements)");
  MemoryFormat format = MemoryFormat::contiguous;
  if (format_ == MemoryFormat::channels_last) {
    if (shape == shape_) format = format_;
    else if (!nchw_order_too(shape_))
      throw Error("reshape: " + detail::describe(*this) + " is channels_last (NHWC in memory) and cannot become " +
                  shape.str() + " without reordering; convert it first (ops::contiguous)");
  }
  Tensor t = wrap(storage_, std::move(shape), format);
  t.offset_ = offset_;
  return t;
}

Tensor Tensor::view(std::int64_t offset, Shape shape) const {
  detail::check_defined("view", *this, "tensor");
  if (format_ == MemoryFormat::channels_last && !(offset == 0 && shape == shape_) && !nchw_order_too(shape_))
    throw InvalidArgument("view: " + detail::describe(*this) + " is channels_last (NHWC in memory); elements [" +
                          std::to_string(offset) + ", " + std::to_string(offset + shape.numel()) + ") as " +
                          shape.str() + " would reorder its values; convert it first (ops::contiguous)");
  if (offset < 0 || shape.numel() > numel() - offset)
    throw InvalidArgument("view: elements [" + std::to_string(offset) + ", " + std::to_string(offset + shape.numel()) +
                          ") as " + shape.str() + " do not lie within " + detail::describe(*this) + " (" +
                          std::to_string(numel()) + " elements)");
  const MemoryFormat format = offset == 0 && shape == shape_ ? format_ : MemoryFormat::contiguous;
  Tensor t = wrap(storage_, std::move(shape), format);
  t.offset_ = offset_ + offset;
  return t;
}

std::int64_t Tensor::storage_offset() const {
  checked();
  return offset_;
}

bool Tensor::overlaps(const Tensor& other) const {
  if (!defined() || !other.defined() || storage_ != other.storage_) return false;
  const std::int64_t n = numel(), m = other.numel();
  if (n == 0 || m == 0) return false;
  return offset_ < other.offset_ + m && other.offset_ < offset_ + n;
}

Tensor Tensor::copy_to(Device device) const {
  detail::check_defined("copy_to", *this, "source");
  check_device(engine(), device, "copy_to", this);
  Tensor dst = Tensor::wrap(std::make_shared<Storage>(engine(), device, dtype(), nbytes(), ""), shape_, format_);
  dst.copy_from(*this);
  return dst;
}

void Tensor::copy_from(const Tensor& src) {
  detail::check_defined("copy_from", *this, "destination");
  detail::check_defined("copy_from", src, "source");
  detail::check_same_shape("copy_from", *this, src);
  detail::check_same_dtype("copy_from", *this, "destination", src, "source");
  detail::check_same_engine("copy_from", *this, src);
  if (src.format_ != format_)
    throw InvalidArgument("copy_from: source " + detail::describe(src) + " is " + std::string(to_string(src.format_)) +
                          " but destination " + detail::describe(*this) + " is " + std::string(to_string(format_)) +
                          " (ops::to_memory_format converts)");
  if (src.storage_ == storage_ && src.offset_ == offset_) return;  // same memory: nothing to copy
  if (overlaps(src))
    throw InvalidArgument("copy_from: source " + detail::describe(src) + " and destination " + detail::describe(*this) +
                          " are overlapping parts of one storage");
  const Device from = src.device(), to = device();
  const std::size_t bytes = nbytes();
  const bool host_from = !from.is_gpu(), host_to = !to.is_gpu();
  if (host_from && host_to) {
    // Host to host: a copy all the same (traces count it as one), on the
    // destination's workers.
    launch("copy " + from.str() + "->" + to.str(), exec_device(to), {&src}, {this}, [bytes](RunContext&, OpIO& io) {
      if (bytes) std::memcpy(io.out[0], io.in[0], bytes);
    }, OpProperty::copy_peer, bytes, detail::Body::bytes);
    return;
  }
  // Pageable host memory cannot be copied asynchronously: stage through a
  // pinned tensor (a CPU op fills or drains it; the GPU op copies it).
  if (host_from && from.kind() != DeviceKind::cpu_pinned) {
    copy_from(src.copy_to(Device::cpu_pinned(0)));
    return;
  }
  if (host_to && to.kind() != DeviceKind::cpu_pinned) {
    copy_from(src.copy_to(Device::cpu_pinned(0)));
    return;
  }
  const std::string name = "copy " + from.str() + "->" + to.str();
  using detail::Body;
  if (host_from) {  // pinned -> gpu
    launch(name, to, {&src}, {this}, [bytes](RunContext& ctx, OpIO& io) {
      gpu::memcpy_async(io.o(0), io.i(0), bytes, gpu::CopyKind::host_to_device, ctx.gpu->stream);
    }, OpProperty::copy_to_device, bytes, Body::stream_calls);
  } else if (host_to) {  // gpu -> pinned
    launch(name, from, {&src}, {this}, [bytes](RunContext& ctx, OpIO& io) {
      gpu::memcpy_async(io.o(0), io.i(0), bytes, gpu::CopyKind::device_to_host, ctx.gpu->stream);
    }, OpProperty::copy_from_device, bytes, Body::stream_calls);
  } else if (from == to) {
    launch(name, to, {&src}, {this}, [bytes](RunContext& ctx, OpIO& io) {
      gpu::memcpy_async(io.o(0), io.i(0), bytes, gpu::CopyKind::device_to_device, ctx.gpu->stream);
    }, OpProperty::normal, bytes, Body::stream_calls);
  } else {
    launch(name, to, {&src}, {this}, [bytes, from, to](RunContext& ctx, OpIO& io) {
      gpu::memcpy_peer_async(io.o(0), to.index(), io.i(0), from.index(), bytes, ctx.gpu->stream);
    }, OpProperty::copy_peer, bytes, Body::stream_calls);
  }
}

Tensor Tensor::operator+(const Tensor& o) const { return ops::add(*this, o); }
Tensor Tensor::operator-(const Tensor& o) const { return ops::sub(*this, o); }
Tensor Tensor::operator*(const Tensor& o) const { return ops::mul(*this, o); }
Tensor Tensor::operator+(float s) const { return ops::add_scalar(*this, s); }
Tensor Tensor::operator*(float s) const { return ops::mul_scalar(*this, s); }
Tensor Tensor::matmul(const Tensor& o) const { return ops::matmul(*this, o); }
Tensor Tensor::relu() const { return ops::relu(*this); }
Tensor Tensor::sum() const { return ops::sum(*this); }
Tensor Tensor::mean() const { return ops::mean(*this); }

MemoryStats memory_stats(Engine& engine, Device device) { return engine.allocator(device).stats(); }

namespace ops {

PushScope::PushScope(int priority, std::string label, Var after, Var chain)
    : saved_priority_(detail::push_scope.priority),
      saved_label_(std::move(detail::push_scope.label)),
      saved_after_(detail::push_scope.after),
      saved_chain_(detail::push_scope.chain) {
  detail::push_scope.priority = priority;
  detail::push_scope.label = std::move(label);
  detail::push_scope.after = after;
  detail::push_scope.chain = chain;
}

PushScope::~PushScope() {
  detail::push_scope.priority = saved_priority_;
  detail::push_scope.label = std::move(saved_label_);
  detail::push_scope.after = saved_after_;
  detail::push_scope.chain = saved_chain_;
}

WaitFor::WaitFor(Var var) { detail::push_scope.wait_for.push_back(var); }
WaitFor::~WaitFor() { detail::push_scope.wait_for.pop_back(); }

AllowTf32::AllowTf32(bool on) : saved_(detail::push_scope.tf32) { detail::push_scope.tf32 = on; }
AllowTf32::~AllowTf32() { detail::push_scope.tf32 = saved_; }
bool AllowTf32::active() noexcept { return detail::push_scope.tf32; }

}  // namespace ops

}  // namespace weft
