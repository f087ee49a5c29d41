// The floor: the ops in push order on the calling thread, no runtime at all.
// Its results are also the reference every other peer's checksum must match.
#include "measure.h"
#include "peer.h"

namespace weft_bench {
namespace {

struct SequentialPeer final : Peer {
  std::string_view name() const override { return "sequential"; }
  std::string describe() const override { return "1 thread, plain loop"; }
  double run(const ShapeSpec& shape, const Body& body, std::uint64_t* items) override {
    const std::uint64_t iters = body.spin_iters;
    Stopwatch sw;
    for_each_op(shape, [&](const Op& op) { run_op(op, items, iters); });
    return sw.seconds();
  }
};

}  // namespace

std::unique_ptr<Peer> make_sequential_peer() { return std::make_unique<SequentialPeer>(); }

}  // namespace weft_bench
