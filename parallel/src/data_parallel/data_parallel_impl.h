// DataParallel's state, shared by its sources: data_parallel.cpp (the bucket
// plan, backward and the reductions), data_parallel_shard.cpp (the optimizer
// step and ZeRO's stages) and data_parallel_checkpoint.cpp (save and load).
// Design notes: docs/design/data-parallel.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "weft/parallel/data_parallel.h"

namespace weft::parallel {

// The empty ops that only order a bucket's steps (its gates, its "done") run
// where its reductions run, on each GPU's priority stream: on the compute
// stream, the event wait of a "done" pushed mid-backward would hold every
// kernel queued after it until the reduction ends (on CPU devices the
// property changes nothing).
inline constexpr OpProperty kOrderingProperty = OpProperty::prioritized;

// One member's chunk of one bucket under sharding: the optimizer's
// parameter. value: the chunk of the bucket's flat parameters (stages 1 and
// 2: a view of the replica's flat parameters; stage 3: kept between steps,
// the master copy; with offload: the master copy on the host); grad: the
// chunk of the reduced gradient (stage 1: a view of the flat gradient; with
// offload: on the host).
struct ShardSlot {
  Chunk range;  // of the bucket's flat layout
  nn::Parameter param;
  std::unique_ptr<optim::Optimizer> optimizer;  // null for an empty chunk
  // With offload: the chunk on the member's GPU that the forward reads
  // (stages 1 and 2: a view of the flat parameters; stage 3: kept between
  // steps, what the gathers read). Undefined otherwise.
  Tensor device_value;
};

// Where a member's chunk of a bucket meets one parameter: the parameter's
// plan position and its elements [begin, end), starting `at` in the chunk.
struct ChunkPiece {
  std::size_t pos;
  std::int64_t begin, end, at;
};

struct DataParallel::Impl {
  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();
  Engine* engine = nullptr;
  std::vector<Device> devices;
  DataParallelOptions options;
  std::size_t bucket_bytes = 0;
  std::vector<std::unique_ptr<nn::Sequential>> replicas;
  // leaves[r]: replica r's layers in forward order; params[r][l]: leaf l's
  // parameters sorted by name (the plan's order within a layer).
  std::vector<std::vector<nn::Layer*>> leaves;
  std::vector<std::vector<std::vector<nn::Parameter*>>> params;
  // The plan: (leaf, index in leaf) in reduction order, and where each bucket
  // ends in it; shapes[pos]: the parameter's shape (stage 3 frees the values).
  std::vector<std::pair<std::size_t, std::size_t>> order;
  std::vector<std::size_t> bucket_end;
  std::vector<Shape> shapes;
  std::vector<GradientBucket> buckets;
  // Stage 3: the bucket of each leaf (-1: a leaf without parameters).
  std::vector<int> leaf_bucket;
  // Stage 3: the buckets a leaf uses, in order: its own, then those of the
  // parameters it is tied to (Layer::tied_parameters: gathered for it too).
  std::vector<std::vector<int>> leaf_uses;
  // Stages none, 1 and 2: each bucket's parameters in one flat tensor per
  // replica ([bucket][replica]); the replica's p.value are views of it, and
  // the stages' all-gathers write it in place.
  std::vector<std::vector<Tensor>> param_flats;
  // Stage 3, from flatten_parameters to setup_optimizer: each member's
  // chunk of each bucket's parameters ([bucket][replica]).
  std::vector<std::vector<Tensor>> initial_chunks;

  // Reduction: one communicator over the replicas' devices (all CPU devices
  // or all GPUs), or, for a mix, sums on the host and `host_comm` across
  // processes.
  std::optional<Communicator> comm, host_comm;
  bool mixed = false;
  int processes = 1, process_rank = 0;
  BucketReduction reduction;

  // The step in progress.
  std::vector<double> weight;                   // per replica, from forward()
  std::vector<std::int64_t> split;              // split_and_load's local parts; empty: none pending
  std::int64_t split_total = 0;                 // ... and the whole batch's rows
  int no_sync_depth = 0;
  // Stages 2 and 3, per replica: written once the last bucket's
  // reduce-scatter is done with its flat (and, under offload, its copy to
  // the host with the GPU's chunk); the next bucket's pack waits for it.
  // in_flight: whether a bucket is (since the backward began).
  // (Raw variables, deleted by ~Impl: a SharedVar's release takes the
  // engine's life lock, which the naive engine's ops would take in the
  // other order.)
  std::vector<Var> bucket_done;
  bool in_flight = false;
  int accumulated = 0;  // backward()s packed into the buckets since the last reduction
  std::vector<std::vector<Tensor>> zeros;       // [replica][plan position], for allow_unused
  // Loss scaling's state per replica ([1] float32 on its device; LossScaling).
  std::vector<Tensor> scale, growth_tracker, skipped;

  // The optimizer: one per replica (Shard::none), or one per (bucket,
  // member) over that member's chunk (slots[bucket][replica]).
  std::int64_t steps = 0;
  std::vector<std::unique_ptr<optim::Optimizer>> optimizers;
  std::vector<std::vector<std::unique_ptr<ShardSlot>>> slots;
  // Stage 3: gathered flat parameters in flight ([bucket][replica]; empty:
  // none), and how many FullParameters are alive. uses: the buckets of a
  // step's layers in the order they run (forward, then backward in
  // reverse); next_use: the next one's position.
  std::vector<std::vector<Tensor>> gathered;
  int full_depth = 0;
  std::vector<int> uses;
  std::size_t next_use = 0;

  int world() const { return processes * static_cast<int>(devices.size()); }
  // The communicator rank of replica r (its member index under sharding).
  int member(std::size_t r) const { return comm ? comm->local_ranks()[r] : static_cast<int>(r); }
  std::string label() const { return "DataParallel"; }
  Shard shard() const { return options.shard; }
  bool offloaded() const { return options.offload.has_value(); }

  nn::Parameter& param(std::size_t r, std::size_t pos) const {
    const auto [leaf, j] = order[pos];
    return *params[r][leaf][j];
  }
  std::size_t bucket_begin(std::size_t b) const { return b == 0 ? 0 : bucket_end[b - 1]; }
  // Replica r's parameters of bucket b, in the flat layout's order.
  std::vector<Tensor> bucket_values(std::size_t b, std::size_t r) const;

  void build_plan();
  void check_replica(std::size_t r) const;
  void check_options() const;
  // Packs every replica's parameters into param_flats, broadcasts them from
  // replica 0 of process 0 and makes the replicas' p.value views of them
  // (stage 3: cuts each member's chunk into initial_chunks instead).
  void flatten_parameters();
  // Replica r's parameters of bucket b become views of `flat`.
  void bind_views(std::size_t b, std::size_t r, const Tensor& flat);
  // Packs bucket b's gradients and pushes its reduction, with one bucket in
  // flight: `next` (the gradients the next layers' backward reads) waits
  // for the pack (the layer gradients freed), a reduction waits for the
  // previous bucket's (bucket_done), and in stages 2 and 3 so does the pack
  // (the previous flat freed first).
  // mark_done: an empty op writing bucket b's flats (and `also`, per
  // replica) and bucket_done waits for every op reading them to be done.
  void mark_done(std::size_t b, const std::vector<Tensor>& also);
  void finish_bucket(std::size_t b, bool sync, const std::vector<std::vector<bool>>& unused,
                     const std::vector<Tensor>& next = {});
  // Every replica's `flats` (of `elements`) become the sum over every
  // replica (or, with broadcast_from_root, replica 0 of process 0's).
  void reduce(const std::vector<Tensor>& flats, std::int64_t elements, const std::string& name,
              bool broadcast_from_root);
  // Each replica's flag becomes the largest over every replica and process.
  void agree_max(std::vector<Tensor>& flags, const std::string& name);

  // ---- data_parallel_shard.cpp ----
  void setup_optimizer();  // after broadcast_parameters
  void step(float lr);
  // Stages 2 and 3: bucket b's reduce-scatter into each member's chunk.
  void reduce_scatter_bucket(std::size_t b);
  // all_gather of each member's chunk into `out` (one [elements] tensor per replica).
  void gather(std::size_t b, const std::vector<Tensor>& chunks, const std::vector<Tensor>& out,
              const std::string& what);
  // Stage 3. gather_bucket: push the gather of bucket b's parameters (if not
  // gathered already; with `after`, one tensor per replica, its memory taken
  // no earlier than they are written). begin_use: the next use of the
  // step's order (bucket b), its layer about to be pushed with inputs
  // `start`: gathers it and the next prefetch_layers uses, gated on
  // `start`, and binds the replicas' p.value to it. end_use: frees it
  // unless a use within the prefetch window needs it again.
  void gather_bucket(std::size_t b, const std::vector<Tensor>& after);
  void begin_use(std::size_t b, const std::vector<Tensor>& start);
  void end_use(std::size_t b);
  void release(std::size_t b);  // p.value and the gathered flat dropped
  void gather_all();            // FullParameters, or a step under it
  // The chunk of bucket b a member's gathers read (its master, or under
  // offload its GPU copy).
  const Tensor& chunk_value(std::size_t b, std::size_t r) const;
  std::vector<Tensor> forward_sharded(const std::vector<Tensor>& inputs);

  // ---- data_parallel_checkpoint.cpp ----
  // The parameters bucket b's `range` covers, in order.
  std::vector<ChunkPiece> chunk_pieces(std::size_t b, const Chunk& range) const;
};

}  // namespace weft::parallel
