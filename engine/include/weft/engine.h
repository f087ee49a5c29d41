// weft::Engine — the asynchronous dependency engine.
//
// A frontend (any thread) pushes ops tagged with the variables they read and
// write; push returns at once and the engine runs each op on a worker of its
// device as soon as its variables allow:
//   * ops sharing a variable that either of them writes run in push order;
//   * ops that only read a variable may run together;
//   * a variable in both lists counts as written, duplicates are ignored;
//   * ready ops of one device run by priority (higher first), FIFO among equals.
// An exception thrown by an op (or passed to its Completion) is stored on the
// variables it writes; ops reading a failed variable are skipped and pass the
// failure on; a wait reports it. See docs/design/engine-invariants.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "weft/allocator.h"
#include "weft/completion.h"
#include "weft/device.h"
#include "weft/error.h"
#include "weft/gpu.h"
#include "weft/op_property.h"
#include "weft/profiler.h"
#include "weft/unique_function.h"
#include "weft/var.h"

namespace weft {

class Engine;

// What a running op learns about where it runs.
struct RunContext {
  Device device;
  int worker = 0;            // index of the worker within its pool
  std::string_view op_name;  // as pushed (may be empty)
  Engine* engine = nullptr;  // for pushing follow-up ops from inside an op
  // GPU ops only: the stream to enqueue on (never synchronize it) and this
  // worker's own cuBLAS/cuDNN handles. The engine has already made the stream
  // wait for every GPU producer of the op's inputs; once the body returns it
  // records an event there and the op's outputs count as ready.
  const gpu::WorkerHandles* gpu = nullptr;
};


using OpFunction = UniqueFunction<void(RunContext&)>;
using AsyncOpFunction = UniqueFunction<void(RunContext&, Completion)>;

struct OpOptions {
  int priority = 0;  // higher runs first among ready ops of one device
  std::string name;  // shown in errors, traces and the profiler's table
  OpProperty property = OpProperty::normal;
  // Payload a copy op moves: traces show it, and the bandwidth, on its span.
  std::uint64_t bytes = 0;
};

struct EngineConfig {
  std::string kind;                // "threaded" | "naive"; empty: $WEFT_ENGINE, else "threaded"
  int cpu_devices = 0;             // 0: $WEFT_CPU_DEVICES, else 1
  int workers_per_cpu_device = 0;  // 0: $WEFT_CPU_WORKERS, else the hardware threads
  // Bound on ops pushed and not yet completed; push blocks the frontend when it
  // is reached, until fewer than a quarter remain (pushes from inside ops never
  // block). 0: $WEFT_MAX_INFLIGHT, else
  // kDefaultMaxInflight.
  std::size_t max_inflight = 0;
  std::string profile_path;  // empty: $WEFT_PROFILE; when set, profile from creation and dump at destruction
  // The process's GPU runtime: "cuda" | "sim" | "none". Empty: $WEFT_GPU_BACKEND,
  // else cuda where a GPU answers, else none. The runtime is chosen once per
  // process (at the first engine or GPU query); asking a later engine for
  // another one is a weft::InvalidArgument. See weft/gpu.h.
  std::string gpu_backend;
  int sim_gpus = 0;                  // simulated GPUs ("sim" only); 0: $WEFT_SIM_GPUS, else 2
  int gpu_devices = -1;              // -1: $WEFT_GPU_DEVICES, else every GPU that answers (0 on CPU machines)
  int compute_streams_per_gpu = 0;   // 0: $WEFT_GPU_STREAMS, else 2
  std::size_t gpu_workspace_bytes = std::size_t{64} << 20;  // per compute stream, for cuDNN/cuBLAS

  // Small enough that a frontend pushing minibatches without a barrier holds
  // only ~20 minibatches of a small model in flight however many it pushes,
  // large enough that the throttled frontend sleeps once per ~400 ops. See
  // docs/design/engine-invariants.md.
  static constexpr std::size_t kDefaultMaxInflight = 512;
};

class Engine {
 public:
  // Throws weft::Error for an unknown kind or a bad setting (naming it).
  static std::unique_ptr<Engine> create(EngineConfig config = {});

  virtual ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A new variable; `name` appears in messages about it.
  virtual Var new_var(std::string_view name = {}) = 0;

  // Runs fn(ctx) on a worker of `device` once the variables allow. Returns at
  // once (unless the in-flight bound is reached). Throws weft::Error at push
  // time for a null function, a null, deleted or foreign Var, or an unknown
  // device.
  virtual void push(OpFunction fn, Device device, VarList reads, VarList writes, OpOptions options = {}) = 0;
  // As push, but the op is complete only when its Completion is called.
  virtual void push_async(AsyncOpFunction fn, Device device, VarList reads, VarList writes,
                          OpOptions options = {}) = 0;

  // Block until all writes pushed before are done; rethrow the variable's error
  // (once). Called from inside an op, they throw weft::Error naming the op.
  virtual void wait_to_read(Var var) = 0;
  // As wait_to_read, and also until all reads pushed before are done.
  virtual void wait_to_write(Var var) = 0;
  // Block until every op pushed before is done; rethrow the first error not
  // yet reported (all pending errors count as reported afterwards).
  virtual void wait_all() = 0;

  // Deletes the variable after everything pending on it; the handle is invalid
  // from this call on.
  virtual void delete_var(Var var) = 0;
  // Number of completed writes to the variable so far.
  virtual std::uint64_t version(Var var) const = 0;

  virtual std::string_view kind() const noexcept = 0;
  virtual std::vector<Device> devices() const = 0;
  virtual int workers(Device device) const = 0;  // size of the device's (compute) pool (throws for unknown devices)
  // The device's caching allocator: cpu(i), cpu_pinned(0) and gpu(i) of this
  // engine. Tensors allocate inside the op that first writes them.
  virtual Allocator& allocator(Device device) = 0;
  virtual std::size_t max_inflight() const noexcept = 0;
  virtual std::size_t inflight() const noexcept = 0;  // ops pushed and not completed, now

  Profiler& profiler() noexcept { return *profiler_; }

 protected:
  Engine();
  std::unique_ptr<Profiler> profiler_;
};

}  // namespace weft
