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

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "weft/allocator.h"
#include "weft/completion.h"
#include "weft/device.h"
#include "weft/error.h"
#include "weft/gpu.h"
#include "weft/gpu_streams.h"
#include "weft/op_graph.h"
#include "weft/op_property.h"
#include "weft/profiler.h"
#include "weft/unique_function.h"
#include "weft/var.h"

namespace weft {

class Engine;
namespace detail {
struct EngineLife;
}

// What a running op learns about where it runs.
struct RunContext {
  Device device;
  int worker = 0;            // index of the worker within its pool; -1: not on a worker (OpOptions::run_inline)
  std::string_view op_name;  // as pushed (may be empty)
  Engine* engine = nullptr;  // for pushing follow-up ops from inside an op
  // GPU ops only: the stream to enqueue on (never synchronize it) and this
  // worker's own cuBLAS/cuDNN handles. The engine has already made the stream
  // wait for every GPU producer of the op's inputs; once the body returns it
  // records an event there and the op's outputs count as ready.
  const gpu::WorkerHandles* gpu = nullptr;
  // OpOptions::run_on_failed_input only: the failure one of the op's inputs
  // carries (null when none does).
  std::exception_ptr failed_input;
  // OpOptions::defer_gpu_waits only: the events of the GPU work the op's
  // variables wait for (their last GPU writers and, for the variables it
  // writes, their GPU readers). Valid during the body's call; copy what you
  // keep. Null otherwise.
  const std::vector<gpu::EventRef>* gpu_waits = nullptr;
};


using OpFunction = UniqueFunction<void(RunContext&)>;
using AsyncOpFunction = UniqueFunction<void(RunContext&, Completion)>;

namespace detail {
// An op body as the engine stores it: callables taking a RunContext& as
// they are; callables taking nothing (push) or only the Completion
// (push_async) wrapped. A null function pointer or empty std::function stays
// empty, so push refuses it.
template <class>
inline constexpr bool kAlwaysFalse = false;

template <class F>
OpFunction to_op_function(F&& fn) {
  if constexpr (std::is_convertible_v<F&&, OpFunction>) {
    return OpFunction(std::forward<F>(fn));
  } else if constexpr (std::is_invocable_v<std::decay_t<F>&>) {
    if constexpr (requires { fn == nullptr; }) {
      if (fn == nullptr) return {};
    }
    return OpFunction([f = std::forward<F>(fn)](RunContext&) mutable { f(); });
  } else {
    static_assert(kAlwaysFalse<F>, "weft::Engine::push: the op must be callable as fn(weft::RunContext&) or fn()");
    return {};
  }
}
template <class F>
AsyncOpFunction to_async_op_function(F&& fn) {
  if constexpr (std::is_convertible_v<F&&, AsyncOpFunction>) {
    return AsyncOpFunction(std::forward<F>(fn));
  } else if constexpr (std::is_invocable_v<std::decay_t<F>&, Completion>) {
    if constexpr (requires { fn == nullptr; }) {
      if (fn == nullptr) return {};
    }
    return AsyncOpFunction(
        [f = std::forward<F>(fn)](RunContext&, Completion done) mutable { f(std::move(done)); });
  } else {
    static_assert(kAlwaysFalse<F>,
                  "weft::Engine::push_async: the op must be callable as fn(weft::RunContext&, weft::Completion) "
                  "or fn(weft::Completion)");
    return {};
  }
}
}  // namespace detail

struct OpOptions {
  int priority = 0;  // higher runs first among ready ops of one device
  std::string name;  // shown in errors, traces and the profiler's table
  OpProperty property = OpProperty::normal;
  // Payload a copy op moves: traces show it, and the bandwidth, on its span.
  std::uint64_t bytes = 0;
  // The op's operands as a cost table keys them ("float32[64,784];...->...",
  // weft/gpu_sim.h): traces show it as the span's "shape" argument. Recorded
  // only while the engine's profiler runs (ops fill it only then).
  std::string shape;
  // Run even when a variable the op reads carries a failure (normally such an
  // op is skipped and passes the failure on): the body finds the failure in
  // ctx.failed_input and decides. Completing (or throwing) with that same
  // exception passes the original failure on, reported once. For ops that
  // must always answer, e.g. a collective's members, which must all learn
  // that one of them cannot take part.
  bool run_on_failed_input = false;
  // push_async only, for a body that hands its work to another thread (a
  // communication thread, say) and returns at once — it never blocks or
  // waits: the engine may run it on whichever thread makes the op ready (the
  // pushing thread, or the one completing the op it waited for) instead of
  // waking a worker of its device, so a chain of such ops costs no thread
  // hand-off per op (MXNet runs its kAsync ops on the pusher the same way).
  // A thread runs one such body at a time: what it makes ready queues as
  // usual. It runs on a worker when GPU work it depends on is unfinished
  // (the wait for it must not block the thread that made it ready).
  // ctx.worker is -1 when it runs elsewhere than on a worker.
  bool run_inline = false;
  // push_async only, for a body whose use of its tensors' memory is all GPU
  // work on streams (the hold op of a collective over GPU members): the
  // engine does not wait on the host for the GPU work behind the op's
  // variables; it hands that work's events to the body (ctx.gpu_waits),
  // which must make every stream it enqueues on wait for them
  // (gpu::Event::stream_wait) and must not touch the memory from the host
  // before they are done (the GPU ops it pushes pass them in
  // after_gpu_work). No worker then blocks while the GPU producers run. Its
  // variables' GPU history is settled as for any CPU op: the op's completion
  // must come after the work it enqueued, and after the events' work even
  // when it fails (a body that throws before completing is covered: the
  // engine then waits for them). With run_inline, the op still runs inline
  // only when that work is done.
  bool defer_gpu_waits = false;
  // GPU ops only: events of GPU work the op's stream must wait for besides
  // its variables' producers (say, what a defer_gpu_waits op was handed).
  // The stream waits for them, as for the producers, before the op's trace
  // span begins.
  std::vector<gpu::EventRef> after_gpu_work;
};

// How GPU convolutions choose their cuDNN algorithm (weft/nn_ops.h):
// heuristic takes cuDNN's ranking (no trial runs); benchmark times the
// candidates on the first use of each geometry, dtype and direction and
// caches the fastest that fits the workspace (cudnn.benchmark, MXNet's
// autotune); deterministic, with either, keeps only algorithms whose results
// repeat bitwise. Written "heuristic", "benchmark", "deterministic" (the
// heuristic, deterministic) or "benchmark+deterministic". CPU devices and
// simulated GPUs have one algorithm, deterministic, and ignore it.
struct ConvAlgo {
  bool benchmark = false;
  bool deterministic = false;
  std::string str() const;
  // Throws weft::InvalidArgument naming `what` (the setting) for other text.
  static ConvAlgo parse(std::string_view text, std::string_view what = "conv_algo");
  friend bool operator==(const ConvAlgo&, const ConvAlgo&) = default;
};

struct EngineConfig {
  std::string kind;                // "threaded" | "naive"; empty: $WEFT_ENGINE, else "threaded"
  int cpu_devices = 0;             // 0: $WEFT_CPU_DEVICES, else 1
  int workers_per_cpu_device = 0;  // 0: $WEFT_CPU_WORKERS, else available_cpus() (weft/device.h)
  // Bound on ops pushed and not yet completed; push blocks the frontend when it
  // is reached, until fewer than a quarter remain (pushes from inside ops never
  // block). 0: $WEFT_MAX_INFLIGHT, else
  // kDefaultMaxInflight.
  std::size_t max_inflight = 0;
  std::string profile_path;  // empty: $WEFT_PROFILE; when set, profile from creation and dump at destruction
  // The process's GPU backend: "cuda" | "sim" | "none". Empty: $WEFT_GPU_BACKEND,
  // else cuda where a GPU answers, else none. The backend is chosen once per
  // process (at the first engine or GPU query); asking a later engine for
  // another one is a weft::InvalidArgument. See weft/gpu.h.
  std::string gpu_backend;
  int sim_gpus = 0;                  // simulated GPUs ("sim" only); 0: $WEFT_SIM_GPUS, else 2
  // The simulator's modeled mode ("sim" only; weft/gpu_sim.h): "dgx-h100", "dgx-h200", "dgx-a100", a
  // profile file or a cost-table file. Empty: $WEFT_SIM_MODEL (unset: off).
  // Set for the process, for GPU work enqueued from then on.
  std::string sim_model;
  int gpu_devices = -1;              // -1: $WEFT_GPU_DEVICES, else every GPU that answers (0 on CPU machines)
  int compute_streams_per_gpu = 0;   // 0: $WEFT_GPU_STREAMS, else 2
  std::size_t gpu_workspace_bytes = std::size_t{64} << 20;  // per compute stream, for cuDNN/cuBLAS
  std::string conv_algo;  // ConvAlgo's text; empty: $WEFT_CONV_ALGO, else "heuristic"

  // Small enough that a frontend pushing minibatches without a barrier holds
  // only ~20 minibatches of a small model in flight however many it pushes,
  // large enough that the throttled frontend sleeps once per ~400 ops. See
  // docs/design/engine-invariants.md.
  static constexpr std::size_t kDefaultMaxInflight = 512;
};

// One op pushed and not completed, as Engine::pending_ops() sees it.
struct PendingOp {
  std::uint64_t id = 0;  // push sequence number (0 for the engine's own holders)
  std::string name;
  Device device;
  bool running = false;  // running on a worker; false: waiting for variables
  // A variable a waiting op has not been granted yet, and who has it now.
  struct Wait {
    std::uint32_t var = 0;  // the variable's id ("var #12")
    std::string var_name;
    bool write = false;          // the op wants to write it (else read it)
    std::uint64_t holder = 0;    // id of an op holding it (0: none found)
    std::string holder_name;
    bool holder_running = false;  // the holder runs (else it waits itself)
    // The op ahead in the variable's queue when nobody the snapshot sees
    // holds the variable (0: none); a holder is also listed when known.
    std::uint64_t behind = 0;
  };
  std::vector<Wait> waits;  // waiting ops only
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

  // Runs fn(ctx) — or fn() for a callable that takes no RunContext — on a
  // worker of `device` once the variables allow; without a device, on
  // cpu(0). Returns at once (unless the in-flight bound is reached). Throws
  // weft::InvalidArgument at push time for a null function, a null, deleted
  // or foreign Var, or an unknown device, naming the op.
  //   engine.push([&] { y = x + 1; }, {vx}, {vy});
  //   engine.push([&](RunContext& ctx) { ... }, Device::cpu(1), {vx}, {vy}, {.name = "step"});
  // (The device is a deduced Device so that `push(fn, {}, {}, {})` means
  // reads, writes and options, on cpu(0).)
  template <class F, std::same_as<Device> D>
  void push(F&& fn, D device, VarList reads, VarList writes, OpOptions options = {}) {
    push_op(detail::to_op_function(std::forward<F>(fn)), device, reads, writes, std::move(options));
  }
  template <class F>
  void push(F&& fn, VarList reads, VarList writes, OpOptions options = {}) {
    push_op(detail::to_op_function(std::forward<F>(fn)), Device::cpu(0), reads, writes, std::move(options));
  }
  // As push, but the op is complete only when its Completion is called (by
  // the op or any thread it hands the Completion to): fn(ctx, done) or
  // fn(done). CPU devices only (GPU ops complete by their stream).
  template <class F, std::same_as<Device> D>
  void push_async(F&& fn, D device, VarList reads, VarList writes, OpOptions options = {}) {
    push_async_op(detail::to_async_op_function(std::forward<F>(fn)), device, reads, writes, std::move(options));
  }
  template <class F>
  void push_async(F&& fn, VarList reads, VarList writes, OpOptions options = {}) {
    push_async_op(detail::to_async_op_function(std::forward<F>(fn)), Device::cpu(0), reads, writes,
                  std::move(options));
  }

  // Block until all writes pushed before are done; rethrow the variable's error
  // (once). Called from inside an op, they throw weft::OpError naming the op.
  virtual void wait_to_read(Var var) = 0;
  // As wait_to_read, and also until all reads pushed before are done.
  virtual void wait_to_write(Var var) = 0;
  // Block until every op pushed before is done; rethrow the first error not
  // yet reported (all pending errors count as reported afterwards).
  virtual void wait_all() = 0;

  // Capture and replay (weft/op_graph.h): between begin_capture and
  // end_capture this thread's pushes to this engine are recorded, not run;
  // replay runs the recorded ops again, as often as wanted. Throws
  // weft::InvalidArgument for a nested capture, one begun inside an op, an
  // end without a begin, and for replaying an invalid graph, another
  // engine's, one whose variable was deleted, or while capturing.
  virtual void begin_capture(CaptureOptions options = {}) = 0;
  virtual OpGraph end_capture() = 0;
  virtual void replay(const OpGraph& graph) = 0;
  virtual bool capturing() const noexcept = 0;  // this thread captures for this engine

  // Bulking (MXNet's bulk execution; docs/design/bulking.md). While this
  // thread's bulk size for this engine is above 1, the ops it pushes with
  // push() are collected, and consecutive ones for one device (with the same
  // property and priority) reach the engine together, as one op over the
  // union of their variables that one worker runs back to back: one
  // dependency hand-off instead of one per op. Each op keeps its meaning —
  // its own errors (a failed op fails what reads it, later ops of the bulk
  // included; the others run), versions, follow-ups and trace span — and the
  // bulk behaves as the ops pushed one after another would, with two
  // differences: the ops are pushed when the bulk is flushed (another thread
  // sees, and waits for, them from then on), and an op using any of the
  // bulk's variables waits for the whole bulk. A flush happens when `ops`
  // are collected, at a push that cannot join (push_async, another device,
  // property or priority, OpOptions::after_gpu_work), and at this thread's
  // wait_to_read, wait_to_write, wait_all, delete_var, begin_capture, replay
  // and set_bulk_size. Pushes while capturing are captured, and pushes from
  // inside ops run as usual: neither is collected. Returns the previous size
  // (0 and 1: off). Set it back (BulkScope does), or end the thread, before
  // the engine ends: a thread that ends pushes what it collected. A flush
  // may throw what the pushes would have (a variable another thread deleted
  // meanwhile), naming the ops.
  virtual std::size_t set_bulk_size(std::size_t ops) = 0;
  virtual std::size_t bulk_size() const noexcept = 0;  // this thread's, for this engine

  // Deletes the variable after everything pending on it; the handle is invalid
  // from this call on.
  virtual void delete_var(Var var) = 0;
  // Number of completed writes to the variable so far.
  virtual std::uint64_t version(Var var) const = 0;
  // Names (or renames) a variable: errors ("var #12 'conv1.weight'"), traces,
  // the dependency graph and the profiler's table use the latest name (for
  // ops recorded before the call too, when renamed while profiling).
  virtual void set_var_name(Var var, std::string_view name) = 0;
  virtual std::string var_name(Var var) const = 0;  // empty when unnamed

  virtual std::string_view kind() const noexcept = 0;
  virtual std::vector<Device> devices() const = 0;
  virtual int workers(Device device) const = 0;  // size of the device's (compute) pool (throws for unknown devices)
  // The device's caching allocator: cpu(i), cpu_pinned(0) and gpu(i) of this
  // engine. Tensors allocate inside the op that first writes them.
  virtual Allocator& allocator(Device device) = 0;
  virtual std::size_t max_inflight() const noexcept = 0;
  virtual std::size_t inflight() const noexcept = 0;  // ops pushed and not completed, now

  Profiler& profiler() noexcept { return *profiler_; }

  // A snapshot, for diagnostics (a hang, a collective's deadline), of the
  // ops waiting for variables — each with the variables it waits for and
  // the op holding each — and of the ops running on a worker that hold a
  // variable; waiting ops first, by push order. Safe from any thread while
  // the engine runs, an op's body included; costs nothing on push until
  // called, and while called briefly holds every variable's lock. An async
  // op whose body has returned and an op ready but not yet started are not
  // listed: a wait on a variable they hold names no holder (holder 0).
  virtual std::vector<PendingOp> pending_ops() const = 0;


  // How the convolutions pushed from now on choose their algorithm
  // (EngineConfig::conv_algo); settable between phases.
  ConvAlgo conv_algo() const noexcept;
  void set_conv_algo(ConvAlgo algo) noexcept;

 protected:
  Engine();
  // Engines call it first thing in their destructor: from then on dropping a
  // SharedVar leaves its variable to the engine's end.
  void close_shared_vars() noexcept;
  // What every push and push_async above comes to.
  virtual void push_op(OpFunction fn, Device device, VarList reads, VarList writes, OpOptions options) = 0;
  virtual void push_async_op(AsyncOpFunction fn, Device device, VarList reads, VarList writes,
                             OpOptions options) = 0;
  std::unique_ptr<Profiler> profiler_;
  // What outlives the engine's handles learns of its end through it.
  const std::shared_ptr<detail::EngineLife>& life() const noexcept { return life_; }
  // As set_bulk_size, for BulkScope's destructor: a failing flush is kept
  // for the next wait_all (and the exit warning) instead of thrown.
  virtual void restore_bulk_size(std::size_t ops) noexcept = 0;

 private:
  friend class SharedVar;
  friend class BulkScope;
  std::shared_ptr<detail::EngineLife> life_;  // what SharedVars hold of the engine
  std::atomic<std::uint8_t> conv_algo_{0};   // bit 0: benchmark, bit 1: deterministic
};

// This thread's pushes to `engine` are bulked, `ops` at a time, for the
// scope's life (Engine::set_bulk_size); the size before it comes back at its
// end, which pushes what is collected.
//   { weft::BulkScope bulk(*engine, 16); for (...) engine->push(...); }
class BulkScope {
 public:
  BulkScope(Engine& engine, std::size_t ops) : engine_(engine), previous_(engine.set_bulk_size(ops)) {}
  ~BulkScope() { engine_.restore_bulk_size(previous_); }
  BulkScope(const BulkScope&) = delete;
  BulkScope& operator=(const BulkScope&) = delete;

 private:
  Engine& engine_;
  std::size_t previous_;
};

}  // namespace weft
