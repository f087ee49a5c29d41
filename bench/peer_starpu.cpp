// StarPU: tasks inserted with STARPU_R / STARPU_RW on one registered variable
// handle per data item; StarPU infers the dependencies from the access modes,
// the same sequential-consistency model as Weft's reads/writes.
#include <starpu.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "measure.h"
#include "peer.h"

namespace weft_bench {
namespace {

struct TaskArg {
  Op op;
  std::uint64_t iters;
};

// Buffers are the op's reads in order, then the item it writes, except that an
// op reading the item it writes (chain) has that one buffer, in RW mode.
void starpu_op_cpu(void* buffers[], void* cl_arg) {
  TaskArg a;
  starpu_codelet_unpack_args(cl_arg, &a);
  const Op& op = a.op;
  auto at = [&](int k) { return reinterpret_cast<std::uint64_t*>(STARPU_VARIABLE_GET_PTR(buffers[k])); };
  const bool in_place = op.nreads == 1 && op.reads[0] == op.write;
  const std::uint64_t in0 = op.nreads > 0 ? *at(0) : 0;
  const std::uint64_t in1 = op.nreads > 1 ? *at(1) : 0;
  *at(in_place ? 0 : static_cast<int>(op.nreads)) = compute_op(op, in0, in1, a.iters);
}

class StarpuPeer final : public Peer {
 public:
  explicit StarpuPeer(int threads) : threads_(threads) {
    starpu_conf conf;
    starpu_conf_init(&conf);
    // CPU workers only, one per hardware thread, like every other peer.
    conf.ncpus = threads;
    conf.ncuda = 0;
    conf.nopencl = 0;
    conf.nmic = 0;
    conf.nmpi_ms = 0;
    if (starpu_init(&conf) != 0) throw std::runtime_error("starpu_init failed");
    starpu_codelet_init(&codelet_);
    codelet_.cpu_funcs[0] = starpu_op_cpu;
    codelet_.nbuffers = STARPU_VARIABLE_NBUFFERS;
    codelet_.name = "weft_bench_op";
    // Idle StarPU workers poll in a tight loop; on a 2-core machine that would
    // steal the cores from whichever peer runs next. Paused workers sleep.
    starpu_pause();
  }

  ~StarpuPeer() override {
    // The items outlive this peer and hold the last run's values, which StarPU
    // does not need to copy anywhere: unregister without coherency.
    starpu_resume();
    for (starpu_data_handle_t h : handles_) starpu_data_unregister_no_coherency(h);
    starpu_shutdown();
  }

  std::string_view name() const override { return "starpu"; }
  std::string describe() const override {
    const starpu_sched_policy* policy = starpu_sched_ctx_get_sched_policy(0);  // 0: the global context
    const char* sched = policy && policy->policy_name ? policy->policy_name : "?";
    return std::to_string(starpu_cpu_worker_get_count()) + " CPU workers (asked for " + std::to_string(threads_) +
           "), scheduler " + sched + ", StarPU " + std::to_string(STARPU_MAJOR_VERSION) +
           "." + std::to_string(STARPU_MINOR_VERSION) + "." + std::to_string(STARPU_RELEASE_VERSION);
  }

  // Handles are registered once on the process-wide items array and reused
  // by every later shape and repetition.
  void prepare(const ShapeSpec& shape, std::uint64_t* items) override {
    if (!handles_.empty() && items != registered_base_)
      throw std::logic_error("starpu peer: the items array moved after registration");
    registered_base_ = items;
    while (handles_.size() < shape.items) {
      starpu_data_handle_t h;
      starpu_variable_data_register(&h, STARPU_MAIN_RAM, reinterpret_cast<uintptr_t>(items + handles_.size()),
                                    sizeof(std::uint64_t));
      handles_.push_back(h);
    }
  }

  // With CPU workers only, the registered main-RAM copy is the only copy, so
  // the bench may reset and checksum `items` directly between runs.
  double run(const ShapeSpec& shape, const Body& body, std::uint64_t*) override {
    const std::uint64_t iters = body.spin_iters;
    starpu_data_handle_t* h = handles_.data();
    starpu_codelet* cl = &codelet_;
    int err = 0;
    // Waking the workers is not part of the work; a resident pool in the
    // other runtimes is already awake (or wakes on the first push).
    starpu_resume();
    Stopwatch sw;
    for_each_op(shape, [&](const Op& op) {
      TaskArg a{op, iters};
      int rc;
      if (op.nreads == 0) {
        rc = starpu_task_insert(cl, STARPU_VALUE, &a, sizeof a, STARPU_RW, h[op.write], 0);
      } else if (op.nreads == 1 && op.reads[0] == op.write) {
        rc = starpu_task_insert(cl, STARPU_VALUE, &a, sizeof a, STARPU_RW, h[op.write], 0);
      } else if (op.nreads == 1) {
        rc = starpu_task_insert(cl, STARPU_VALUE, &a, sizeof a, STARPU_R, h[op.reads[0]], STARPU_RW, h[op.write], 0);
      } else {
        rc = starpu_task_insert(cl, STARPU_VALUE, &a, sizeof a, STARPU_R, h[op.reads[0]], STARPU_R, h[op.reads[1]],
                                STARPU_RW, h[op.write], 0);
      }
      if (rc != 0) err = rc;
    });
    starpu_task_wait_for_all();
    const double seconds = sw.seconds();
    starpu_pause();
    if (err != 0) throw std::runtime_error("starpu_task_insert failed: " + std::to_string(err));
    return seconds;
  }

 private:
  int threads_;
  starpu_codelet codelet_{};
  std::vector<starpu_data_handle_t> handles_;
  std::uint64_t* registered_base_ = nullptr;
};

}  // namespace

std::unique_ptr<Peer> make_starpu_peer(int threads) { return std::make_unique<StarpuPeer>(threads); }

}  // namespace weft_bench
