// A captured op graph (weft/op_graph.h): the recorded ops as op blocks the
// graph owns, their dependencies resolved once, and what a replay holds of
// the engine's variables. docs/design/capture-replay.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine_life.h"
#include "op_block.h"
#include "var_table.h"
#include "weft/gpu_streams.h"

namespace weft::detail {

struct GraphImpl : std::enable_shared_from_this<GraphImpl> {
  ~GraphImpl();

  // Adds a prepared user op (its fields and accesses move into a node block
  // of the graph; `op` goes back to its pool by the caller).
  void add(OpBlock& op);
  // Resolves the dependencies and the union of accesses. `self` is the
  // graph's own variable (written by every replay, so replays never overlap).
  // `fold`: GPU segments first become one node each (fold_gpu_segments).
  void seal(Var self, VarSlot* self_slot, bool fold);
  // Whether every variable the graph touches is still alive; when not, the
  // first deleted one, a captured op that uses it and that op's place in
  // capture order (null and ops() when only the graph's own variable).
  const VarEntry* deleted_var(const OpBlock** user, std::uint32_t* index) const noexcept;
  // Runs of at least two consecutive captured GPU ops of one device, stream
  // role and priority (not inline) become one node of kind bulk each — the
  // ops its members, linked by ready_next — over the union of their
  // accesses. A run holds no other op between its members in capture order,
  // so no path leaves it and comes back: the graph stays acyclic.
  void fold_gpu_segments();

  std::uint32_t engine_id = 0;
  bool gpu_graphs = false;    // CaptureOptions::gpu_graphs
  std::size_t captured = 0;   // ops captured (nodes.size() unless folded)
  std::shared_ptr<EngineLife> life;  // the engine, while it lives
  Var self;                          // deleted with the graph (while the engine lives)

  // Node blocks in capture order, allocated in chunks (a replay walks them
  // in order: contiguous memory keeps that a stream).
  std::vector<OpBlock*> nodes;
  // Node i's first op in capture order (its push id is first_id + that; a
  // folded node's members follow it).
  std::vector<std::uint32_t> first_op;
  std::vector<std::unique_ptr<OpBlock[]>> chunks;
  static constexpr std::size_t kChunk = 256;
  // Successors of node i: succ[succ_begin[i] .. succ_begin[i + 1]).
  std::vector<std::uint32_t> succ_begin, succ;
  std::vector<std::int32_t> in_degree;
  std::vector<std::uint32_t> roots;  // nodes without predecessors, in capture order
  // The union of the nodes' accesses, sorted by slot (push's lock order),
  // written where any node writes, plus `self` written.
  std::vector<VarEntry> vars;

  // Per replay (one at a time): nodes not yet done, plus one per async body
  // running (it may go on after its done()) and one per root token not yet
  // run to its end; the holder of the variables.
  std::atomic<std::int64_t> remaining{0};
  OpBlock* holder = nullptr;
  std::uint64_t first_id = 0;  // captured op k's push id is first_id + k
  // Per node: predecessors not yet done (compact: reset at each replay
  // without touching the node blocks).
  std::unique_ptr<std::atomic<std::int32_t>[]> pending;

  // The threaded engine's holders: blocks holding `vars` as entries, made
  // once and reused (several replays of one graph may be queued at once).
  OpBlock* acquire_holder();
  void release_holder(OpBlock* holder) noexcept;
  std::mutex holders_mutex;
  std::vector<std::unique_ptr<OpBlock>> free_holders;  // at most kFreeHolders kept
  static constexpr std::size_t kFreeHolders = 2;

  // The threaded engine's root batches, made at the first replay: the roots
  // of one CPU device, which its workers claim in chunks through `claimed`
  // (tokens: blocks of kind graph_roots queued instead of each root).
  struct RootBatch {
    std::uint32_t pool = 0;
    std::vector<std::uint32_t> nodes;
    std::vector<std::unique_ptr<OpBlock>> tokens;
    std::unique_ptr<std::atomic<std::size_t>> claimed = std::make_unique<std::atomic<std::size_t>>(0);
  };
  // GPU segments (fold_gpu_segments): the folded node, and its stream
  // graphs once captured — one per stream it ran on. Touched only by the
  // worker running the segment (replays never overlap).
  struct Segment {
    std::unique_ptr<OpBlock> node;
    std::uint32_t ops = 0;
    bool failed = false;  // its capture failed: op by op for good
    // Streams it ran on op by op once (the warm-up: libraries set up per
    // stream; the first replay allocates what the ops write).
    std::vector<gpu::Stream*> warmed;
    std::vector<std::pair<gpu::Stream*, std::unique_ptr<gpu::StreamGraph>>> graphs;
    gpu::StreamGraph* graph_for(gpu::Stream* stream) const noexcept {
      for (const auto& [s, g] : graphs)
        if (s == stream) return g.get();
      return nullptr;
    }
  };
  std::vector<Segment> segments;
  std::vector<std::int32_t> segment_of;  // per node: its segment, or -1

  bool batched = false;
  std::vector<RootBatch> root_batches;
  std::vector<std::uint32_t> single_roots;  // roots dispatched one by one (GPU pools, small batches)
};

}  // namespace weft::detail
