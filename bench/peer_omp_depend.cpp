// OpenMP tasks with depend clauses on the data items: the closest standard
// analogue of a dependency engine. One thread creates every task (parallel +
// single), as the Weft frontend pushes every op. This is the only file built
// with -fopenmp, so the other peers are not affected by OpenMP's runtime.
#include <omp.h>

#include "measure.h"
#include "peer.h"

namespace weft_bench {
namespace {

class OmpDependPeer final : public Peer {
 public:
  explicit OmpDependPeer(int threads) : threads_(threads) {}

  std::string_view name() const override { return "omp_depend"; }
  std::string describe() const override {
    return std::to_string(threads_) + " threads, " + std::to_string(_OPENMP) + " (OpenMP spec date)";
  }

  double run(const ShapeSpec& shape, const Body& body, std::uint64_t* items) override {
    const std::uint64_t iters = body.spin_iters;
    Stopwatch sw;
#pragma omp parallel num_threads(threads_) default(none) shared(shape, items, iters)
#pragma omp single
    for_each_op(shape, [&](const Op& op) {
      // depend lists are fixed at compile time, so one task construct per
      // arity; an op that reads the item it writes (chain) is inout.
      if (op.nreads == 0) {
#pragma omp task default(none) firstprivate(op, items, iters) depend(out : items[op.write])
        run_op(op, items, iters);
      } else if (op.nreads == 1 && op.reads[0] == op.write) {
#pragma omp task default(none) firstprivate(op, items, iters) depend(inout : items[op.write])
        run_op(op, items, iters);
      } else if (op.nreads == 1) {
#pragma omp task default(none) firstprivate(op, items, iters) depend(in : items[op.reads[0]]) \
    depend(out : items[op.write])
        run_op(op, items, iters);
      } else {
#pragma omp task default(none) firstprivate(op, items, iters) depend(in : items[op.reads[0]], items[op.reads[1]]) \
    depend(out : items[op.write])
        run_op(op, items, iters);
      }
    });
    // The parallel region's closing barrier waits for every task.
    return sw.seconds();
  }

 private:
  int threads_;
};

}  // namespace

std::unique_ptr<Peer> make_omp_depend_peer(int threads) { return std::make_unique<OmpDependPeer>(threads); }

}  // namespace weft_bench
