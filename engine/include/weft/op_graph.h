// weft::OpGraph — a captured sequence of ops, replayed with one call.
//
//   engine.begin_capture();
//   step(batch);                        // pushes ops: recorded, not run
//   weft::OpGraph graph = engine.end_capture();
//   for (...) { load(batch); engine.replay(graph); }
//
// Between begin_capture and end_capture every push and push_async of the
// capturing thread to that engine is validated as usual and recorded instead
// of run; the dependencies between the recorded ops are resolved once, at
// end_capture. replay(graph) then runs the ops again — the same bodies on the
// same variables, so new data placed in those variables — with the effect of
// pushing them again in capture order (the naive engine does exactly that).
// The threaded engine queues the whole graph as one access to the union of
// its variables (written where any op writes, read elsewhere): ops pushed
// before a replay that touch its variables finish first, ops pushed after it
// wait for the whole replay, and inside it the ops run as their captured
// dependencies allow, on their devices' workers, without per-op dependency
// tracking. Two replays of one graph never overlap. Errors travel as for
// pushed ops: a failing op's error is stored on what it writes, later ops
// reading it are skipped, a wait reports it.
//
// Misuse is a weft::InvalidArgument naming the call: a wait on the capturing
// engine from the capturing thread (the ops have not run), pushing to
// another engine while capturing, nested or unmatched captures, replaying a
// graph on another engine, or a graph whose variable was deleted since.
// Like a Tensor, a graph (its bodies hold their captures) must be destroyed
// before its engine. See docs/design/capture-replay.md.
#pragma once

#include <cstddef>
#include <memory>

namespace weft {

namespace detail {
struct GraphImpl;
class EngineBase;
}  // namespace detail

class OpGraph {
 public:
  OpGraph() = default;  // invalid: replay refuses it

  bool valid() const noexcept { return impl_ != nullptr; }
  std::size_t ops() const noexcept;           // ops captured
  std::size_t dependencies() const noexcept;  // edges between them (each pair once)
  std::size_t vars() const noexcept;          // variables the graph touches

 private:
  friend class detail::EngineBase;
  explicit OpGraph(std::shared_ptr<detail::GraphImpl> impl) noexcept : impl_(std::move(impl)) {}
  std::shared_ptr<detail::GraphImpl> impl_;
};

}  // namespace weft
