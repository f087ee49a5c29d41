// The common interface of the bench's peers: each peer runs a shape's ops with
// a body on its own runtime and says how long that took.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "shapes.h"
#include "work_body.h"

namespace weft_bench {

struct Peer {
  virtual ~Peer() = default;
  virtual std::string_view name() const = 0;
  // One line for the header: threads and whatever settings the runtime chose.
  virtual std::string describe() const = 0;
  // Untimed set-up before the runs of one shape (Weft creates vars, StarPU
  // registers handles). `items` is the same array for the whole process and
  // holds at least shape.items values.
  virtual void prepare(const ShapeSpec& /*shape*/, std::uint64_t* /*items*/) {}
  // Runs every op of `shape` once on `items` and returns the wall-clock seconds
  // from the first push (or graph construction) until all ops are done.
  // Teardown that is not part of running the ops stays outside the seconds.
  virtual double run(const ShapeSpec& shape, const Body& body, std::uint64_t* items) = 0;
};

// One factory per peer_*.cpp; `threads` is the machine's hardware threads.
std::unique_ptr<Peer> make_sequential_peer();
#ifndef WEFT_BENCH_NO_WEFT
std::unique_ptr<Peer> make_weft_peer();
std::unique_ptr<Peer> make_weft_replay_peer();
std::unique_ptr<Peer> make_weft_bulk_peer();
std::unique_ptr<Peer> make_weft_push_alone_peer();
std::unique_ptr<Peer> make_weft_drain_alone_peer();
#endif
std::unique_ptr<Peer> make_tbb_flow_graph_peer(int threads);
#ifdef WEFT_BENCH_HAVE_OMP
std::unique_ptr<Peer> make_omp_depend_peer(int threads);
#endif
#ifdef WEFT_BENCH_HAVE_STARPU
std::unique_ptr<Peer> make_starpu_peer(int threads);
#endif

}  // namespace weft_bench
