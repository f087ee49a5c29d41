#include "cpu/intra_op.h"

#include <cblas.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "weft/device.h"
#include "weft/error.h"
#include "weft/ops.h"

namespace weft::kernels::cpu {
namespace {

struct ArenaState {
  std::mutex mu;
  std::unique_ptr<tbb::task_arena> arena;   // owned; replaced only by set_intra_op_threads
  std::atomic<tbb::task_arena*> current{};  // lock-free read on the hot path of every kernel
  int threads = 0;                          // 0: hardware concurrency
  std::unique_ptr<tbb::global_control> above_hardware;  // lifts TBB's worker cap past the core count
};

ArenaState& state() {
  static ArenaState s;
  return s;
}

// The CPUs this process may run on (its affinity mask), as the engine's default workers.
int default_threads() { return weft::available_cpus(); }

void pin_openblas_once() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace

tbb::task_arena& intra_op_arena() {
  ArenaState& s = state();
  if (tbb::task_arena* a = s.current.load(std::memory_order_acquire)) return *a;
  std::lock_guard lock(s.mu);
  if (!s.arena) {
    pin_openblas_once();
    s.arena = std::make_unique<tbb::task_arena>(s.threads > 0 ? s.threads : default_threads());
    s.current.store(s.arena.get(), std::memory_order_release);
  }
  return *s.arena;
}

void set_intra_op_threads(int n) {
  if (n < 1) throw Error("set_intra_op_threads: need at least 1 thread, got " + std::to_string(n));
  ArenaState& s = state();
  std::lock_guard lock(s.mu);
  pin_openblas_once();
  s.threads = n;
  // TBB caps its workers at the core count unless told otherwise; asking for
  // more slots than cores is then silently (and noisily, on stderr) ignored.
  if (n > default_threads())
    s.above_hardware = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                             static_cast<std::size_t>(n));
  else
    s.above_hardware.reset();
  auto fresh = std::make_unique<tbb::task_arena>(n);
  s.current.store(fresh.get(), std::memory_order_release);
  s.arena = std::move(fresh);
}

int intra_op_threads() {
  ArenaState& s = state();
  std::lock_guard lock(s.mu);
  return s.threads > 0 ? s.threads : default_threads();
}

}  // namespace weft::kernels::cpu

namespace weft::ops {
void set_cpu_kernel_threads(int n) { kernels::cpu::set_intra_op_threads(n); }
int cpu_kernel_threads() { return kernels::cpu::intra_op_threads(); }
}  // namespace weft::ops
