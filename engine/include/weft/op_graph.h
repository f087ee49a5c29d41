// weft::OpGraph — a captured sequence of ops, replayed with one call.
//
//   engine.begin_capture();
//   step(batch);                        // pushes ops: recorded, not run
//   weft::OpGraph graph = engine.end_capture();
//   for (...) { load(batch); engine.replay(graph); }
//
// Between begin_capture and end_capture the capturing thread's pushes to that
// engine are validated as usual and recorded instead of run. replay(graph)
// has the effect of pushing them again in capture order (the same bodies on
// the same variables), as one access to all of the graph's variables: ops
// pushed before it that use any of them finish first, ops pushed after it
// wait for all of it, and two replays of one graph never overlap. Errors
// travel as for pushed ops. Misuse is a weft::InvalidArgument naming the call
// (a wait on the capturing engine from the capturing thread, pushing to
// another engine while capturing, nested or unmatched captures, replaying on
// another engine or after one of the graph's variables was deleted). Destroy
// a graph before its engine. How it runs: docs/design/capture-replay.md.
#pragma once

#include <cstddef>
#include <memory>

namespace weft {

// How a capture's ops replay (Engine::begin_capture).
struct CaptureOptions {
  // GPU ops of one device and stream role captured back to back (no other
  // op between them in capture order) replay as one stream graph — a CUDA
  // Graph; simulated GPUs record their stream items — launched with one
  // call: the threaded engine runs such a segment's ops op by op at the
  // first replay (their bodies allocate what they write then), captures
  // what their bodies enqueue at the second, and from then on only launches
  // the graph: the bodies are not called again. They must therefore enqueue
  // the same work on the same memory at every replay — fixed shapes and
  // buffers, scalars fixed at capture (CUDA Graphs' own contract) — and a
  // graph is made per stream it ran on (after a warm-up on that stream).
  // Only what a body enqueues on its own stream (RunContext::gpu) is
  // captured; work it puts on other streams runs once, at the capture, and
  // ops it pushes from its body are pushed at the warm-up and the capture
  // only. A segment runs op by op at a replay where one of its inputs
  // carries a failure (so each op fails or runs as pushed), and from then on
  // for good when its capture fails: a body threw, allocated device memory,
  // or enqueued what a graph cannot hold (a host function, an event record
  // or wait, a synchronization); that replay calls its bodies again, op by
  // op, and the engine says why on stderr once. A launch is one trace span,
  // named after the segment. The naive engine (the oracle) ignores it.
  // docs/design/capture-replay.md, "Stream graphs".
  bool gpu_graphs = false;
};

namespace detail {
struct GraphImpl;
class EngineBase;
}  // namespace detail

class OpGraph {
 public:
  OpGraph() = default;  // invalid: replay refuses it

  bool valid() const noexcept { return impl_ != nullptr; }
  std::size_t ops() const noexcept;           // ops captured
  // Edges between the graph's nodes, each pair once (a GPU segment folded
  // for CaptureOptions::gpu_graphs is one node).
  std::size_t dependencies() const noexcept;
  std::size_t vars() const noexcept;          // variables the graph touches
  // GPU segments replayed as stream graphs (CaptureOptions::gpu_graphs; 0
  // on the naive engine) and the ops in them.
  std::size_t gpu_segments() const noexcept;
  std::size_t gpu_segment_ops() const noexcept;

 private:
  friend class detail::EngineBase;
  explicit OpGraph(std::shared_ptr<detail::GraphImpl> impl) noexcept : impl_(std::move(impl)) {}
  std::shared_ptr<detail::GraphImpl> impl_;
};

}  // namespace weft
