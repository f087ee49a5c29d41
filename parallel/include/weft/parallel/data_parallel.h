// weft::parallel::DataParallel — synchronous data-parallel training of an
// nn::Sequential: one replica per device (and, with `distributed`, per
// process of an mpirun job), its gradients reduced bucket by bucket while
// backward still runs. One step:
//
//   std::vector<Tensor> x = dp.split_and_load(batch_shape, images);  // rows split over every replica
//   std::vector<Tensor> y = dp.split_and_load(label_shape, labels);
//   std::vector<Tensor> logits = dp.forward(x);
//   std::vector<Tensor> dlogits;  // the mean loss's gradient, per replica
//   for (...) dlogits.push_back(ops::softmax_cross_entropy(logits[i], y[i]).dlogits);
//   dp.backward(dlogits);  // grads reduced, bucket by bucket, while backward goes on
//   dp.step(lr);           // the optimizer's update (DataParallelOptions::optimizer)
//
// All of it pushes engine ops and returns at once. After backward() every
// replica holds the gradient of the whole batch's mean loss, whatever the
// split: k steps on 2 devices with b/2 rows each equal k steps on one device
// with b rows. Every replica and rank must build the same model; a different
// bucket plan across processes fails every rank at construction, naming the
// first parameters of both sides. Not thread-safe: drive a DataParallel from
// one thread. With DataParallelOptions::shard, members keep only their
// chunk of the optimizer state, the gradients or the parameters too (ZeRO
// stages 1-3; see Shard). The bucket plan, the overlap, the weighting and
// the sharding: docs/design/data-parallel.md; its figures:
// weft/parallel/metrics.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weft/checkpoint.h"
#include "weft/nn.h"
#include "weft/nn_ops.h"
#include "weft/optim.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

namespace weft::parallel {

// One run of consecutive parameters in reduction order, and its flat tensors.
struct GradientBucket {
  int index = 0;                         // reduction order: bucket 0 is reduced first
  std::vector<std::string> parameters;   // names, in the flat layout's order
  std::vector<std::int64_t> offsets;     // first element of each in the flat tensor
  std::int64_t elements = 0;
  // One per replica of this process ([elements] float32 on its device): what
  // the reduction reads (the weighted gradients) and must leave (their sum
  // over every replica of every process). After backward() the replica's
  // gradients are views of it (Tensor::view: no second copy). Under
  // Shard::gradients and Shard::parameters they exist only from a
  // backward's pack to the bucket's reduce-scatter (undefined between
  // steps).
  std::vector<Tensor> flat;
};

// Pushes the ops that reduce one bucket. The default
// (DataParallel::reduce_bucket) is an allreduce-sum; a replacement (a
// compressed or sharded form) must leave the same sum, in push order.
using BucketReduction = std::function<void(const GradientBucket&)>;

class DataParallel;

// A bucket reduction that sends half-precision gradients (half the bytes of
// float32): per bucket and replica, the float32 flat tensor is cast to
// `dtype` (rounded to nearest even), the half tensors are allreduced (sum;
// NCCL natively, the other transports in float32, rounded once) and the
// result is cast back into the flat tensor. It equals the float32 sum within
// two roundings of `dtype` (each replica's part, then the sum). With
// error_feedback, each replica keeps a float32 residual per bucket, what its
// last cast dropped, and adds it to its next contribution before the cast,
// so rounding errors do not accumulate over steps. All of it is pushed ops;
// `dp` must outlive the reduction. Throws weft::InvalidArgument for a dtype
// other than bfloat16 or float16, or replicas on a mix of CPU devices and
// GPUs. Install: dp.set_reduction(half_precision_reduction(dp)).
struct HalfReductionOptions {
  DType dtype = DType::bfloat16;
  bool error_feedback = false;
};
BucketReduction half_precision_reduction(DataParallel& dp, HalfReductionOptions options = {});

// Dynamic loss scaling (PyTorch's GradScaler rules), for fp16 training:
// backward() multiplies each replica's output gradient by the scale; step()
// divides the reduced gradients by it, checks them for Inf and NaN in one op
// per replica, agrees on the verdict across every replica and process (a
// one-element allreduce, so all skip together even when each holds only part
// of the gradients), then updates, or skips the update on the device, and
// grows or backs off the scale. The host never waits for the verdict.
struct LossScaling {
  float init_scale = 65536.0f;  // 2^16
  ops::LossScaleRule rule;      // x2 after 2000 clean steps, x0.5 on Inf/NaN
};

// What each member of the group keeps (ZeRO, Rajbhandari et al. 2020; N
// members, every bucket split into N chunks as reduce_scatter splits it):
//   none:       everything, on every member (plain data parallelism).
//   optimizer:  stage 1: the optimizer state of its chunk of every bucket
//               only; after the allreduce it updates its chunk and an
//               all_gather brings every member the updated parameters.
//   gradients:  stage 2: also only its chunk of the gradients: buckets
//               reduce-scatter instead of allreducing, and the full
//               gradients are freed once packed.
//   parameters: stage 3 (FSDP): also only its chunk of the parameters. A
//               layer's full parameters are all-gathered just before its
//               forward and again before its backward (prefetch_layers
//               ahead, so the gathers overlap compute; memory is taken no
//               earlier than that) and freed after use; buckets follow
//               layers. Between steps the replicas' parameter values are
//               undefined (FullParameters gathers them), and after
//               backward() so are their grads (stages 2 and 3).
// Each replica's parameters are views of one flat tensor per bucket (the
// gathered one under stage 3), and after backward() its gradients views of
// the bucket's flat gradient (stages none and 1): nothing is held twice.
// All of it is engine ops over the collectives: in-process, across MPI
// ranks and hierarchically alike; the same optimizer gives the same weights
// as `none` (bitwise where the summation order is the same). Sharding needs
// replicas on CPU devices only or GPUs only; stages 2 and 3 take no
// set_reduction (theirs is the reduce-scatter).
enum class Shard : std::uint8_t { none, optimizer, gradients, parameters };
std::string_view to_string(Shard shard) noexcept;
// "none", "optimizer", "gradients", "parameters" (also "0".."3"); throws
// weft::InvalidArgument naming `what` and the choices.
Shard parse_shard(std::string_view text, std::string_view what = "shard");

struct DataParallelOptions {
  // Bucket capacity. 0: one bucket per parameter. Also $WEFT_BUCKET_BYTES.
  // With Shard::parameters a bucket is one layer's parameters instead.
  std::optional<std::size_t> bucket_bytes;  // default 25 MiB (as PyTorch DDP)
  // Push each bucket's reduction as soon as its last gradient is pushed
  // (true), or all of them after the whole backward (false: the baseline
  // without overlap).
  bool overlap = true;
  // Replicas across the processes of an MPI job too (mpirun): process p's
  // devices[k] is replica p * devices.size() + k; every process gives as many
  // devices. false: this process's devices only.
  bool distributed = false;
  // A parameter whose gradient a backward did not set: false -> weft::Error
  // naming it; true -> its gradient counts as zero in that step.
  bool allow_unused = false;
  // Set: dynamic loss scaling (LossScaling). Unset: none.
  std::optional<LossScaling> loss_scaling;
  // The update step() pushes (weft/optim.h); default: plain SGD.
  optim::OptimizerOptions optimizer;
  // Set: global gradient-norm clipping before each update (the norm of the
  // whole reduced gradient, its partial sums allreduced across members on
  // the device when they are sharded; no host synchronization).
  std::optional<float> max_grad_norm;
  Shard shard = Shard::none;
  // Shard::parameters: how many layers' parameters are gathered ahead of
  // the layer that runs (FSDP's prefetch), each gathered no earlier than
  // that many layers before its use, so at most prefetch_layers + 1 layers
  // are gathered at a time; 0: each only when its layer can start (least
  // memory, no overlap of the gathers). In [0, layers with parameters];
  // weft::InvalidArgument otherwise.
  int prefetch_layers = 1;
  // ZeRO-Offload (Ren et al. 2021). Set to a host device (cpu_pinned(0),
  // whose copies to and from GPUs need no staging, or cpu(i)): each member's
  // chunk of the float32 master parameters, of the reduced gradient and of
  // the optimizer state lives there, and the update runs on that device's
  // workers. Each bucket's gradient chunk is copied to the host as soon as
  // it is reduced, so the updates run while the GPUs' backward goes on, and
  // the updated chunk is copied back to the member's GPU, where the next
  // forward gathers it. Needs GPU members and Shard::optimizer or above;
  // weft::InvalidArgument otherwise, naming the device.
  std::optional<Device> offload;
  // Collectives are named "<name> bucket <k>" (traces, mismatch messages).
  std::string name = "grad";
  CommunicatorOptions communicator;  // distributed: timeouts, fingerprints, ranks per node
};

// Row counts of `rows` split over `parts`: balanced, the first rows % parts
// one more.
std::vector<std::int64_t> split_rows(std::int64_t rows, int parts);

class DataParallel {
 public:
  // Builds a replica on a device; every call must build the same model (the
  // same layers, parameter names and shapes; the values are replaced by
  // replica 0's of process 0).
  using ReplicaFactory = std::function<std::unique_ptr<nn::Sequential>(Device device)>;

  // devices: distinct devices of `engine` (CPU devices, GPUs, or a mix). The
  // parameters must be float32. Broadcasts replica 0's parameters to every
  // replica (pushed; ordered before everything later). Throws
  // weft::InvalidArgument for bad devices, a factory that returns null, or
  // replicas that differ (naming the first parameter that does).
  DataParallel(Engine& engine, std::vector<Device> devices, const ReplicaFactory& make_replica,
               DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  Engine& engine() const noexcept;
  const std::vector<Device>& devices() const noexcept;  // this process's replicas
  int replicas() const noexcept;                        // this process's
  int world_size() const noexcept;                      // every process's
  int process_rank() const noexcept;                    // 0 without distributed
  int processes() const noexcept;
  nn::Sequential& replica(int i) const;
  const std::vector<GradientBucket>& buckets() const noexcept;
  // One line per bucket: "bucket 0: 102528 elements (400.5 KiB): fc2.weight fc2.bias fc1.weight fc1.bias"
  std::string describe_buckets() const;
  // What comm_overlap() (weft/parallel/metrics.h) looks for in span names.
  std::string comm_marker() const;
  // With offload: what gpu_overlap() looks for (the offloaded updates' ops).
  std::string offload_marker() const;

  // The whole batch (rows along dim 0, the same host data on every process)
  // split over every replica; returns this process's parts, on their
  // devices. The next forward() weighs each replica by its part. Throws
  // weft::InvalidArgument when there are fewer rows than replicas, or the
  // data's size is not the shape's.
  std::vector<Tensor> split_and_load(const Shape& shape, std::span<const float> data);

  // One input per replica (on its device); returns each replica's output.
  // With inputs of your own (not split_and_load's), every process is
  // assumed to have as many rows as this one.
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs);
  // One output gradient per replica (of its mean loss). Pushes every layer's
  // backward and the bucket reductions; afterwards each parameter's grad, on
  // every replica, is the gradient of the whole batch's mean loss (inside
  // no_sync: this replica's own, unreduced, and the reduction waits).
  void backward(const std::vector<Tensor>& output_grads);
  // The optimizer's update at rate `lr` (options.optimizer.lr when omitted)
  // on every replica, or on each member's chunk when sharded (with loss
  // scaling: unscaled, checked and skipped on Inf/NaN, see LossScaling;
  // with max_grad_norm: clipped first). Throws weft::Error when the last
  // backward ran inside no_sync (its gradients are not reduced yet).
  void step();
  void step(float lr);
  // step() calls so far (a checkpoint restores it).
  std::int64_t steps() const noexcept;
  const optim::OptimizerOptions& optimizer() const noexcept;

  // ---- checkpoints (weft/checkpoint.h) -----------------------------------
  // Saves the training state to checkpoint directory `dir`, one shard per
  // process (rank 0 writes the index, and with run_dir points
  // run_dir/latest at it): replica 0's parameters and buffers, the
  // optimizer state ("<parameter>.<state>") and the loss scaler's
  // ("loss_scale.scale", ...), named as an unsharded one-device model names
  // them. Replicated tensors are written by process 0; sharded ones as
  // pieces by the members that own them. `metadata` is stored beside
  // (with "weft.steps"). Snapshots are pushed after the pushed step; the
  // files are written in the background (PendingSave). Collective: every
  // process calls it alike. Process 0 takes run_dir's lock first, then the
  // processes agree on the save's identity (a random one from process 0),
  // so no shard of a crashed earlier save passes for this one; with
  // run_dir, all but its newest `keep` checkpoints are deleted once
  // `latest` names this one (checkpoint::SaveOptions).
  checkpoint::PendingSave save_checkpoint(const std::filesystem::path& dir, checkpoint::Metadata metadata = {},
                                          const std::filesystem::path& run_dir = {}, int keep = 3);
  // Loads a checkpoint saved by any number of processes, devices and shard
  // settings (resharding as needed) into every replica: validates
  // everything first (weft::InvalidArgument naming the file and key; the
  // state is then untouched), then pushes the copies. Restores steps().
  void load_checkpoint(const checkpoint::Reader& reader);

  // Stage 3: while alive, every replica holds its full parameters (pushed
  // all-gathers), e.g. for an evaluation pass or to read the weights;
  // freed again at its end. Other stages: nothing to do.
  class FullParameters {
   public:
    FullParameters(FullParameters&& other) noexcept : dp_(std::exchange(other.dp_, nullptr)) {}
    FullParameters(const FullParameters&) = delete;
    FullParameters& operator=(const FullParameters&) = delete;
    FullParameters& operator=(FullParameters&&) = delete;
    ~FullParameters();

   private:
    friend class DataParallel;
    explicit FullParameters(DataParallel* dp) : dp_(dp) {}
    DataParallel* dp_;
  };
  FullParameters full_parameters();
  // Per member of this process: the bytes of its parameters, gradients and
  // optimizer state as held between steps on its device (what sharding
  // divides; with offload, what stays on the GPU).
  std::vector<std::size_t> state_bytes() const;
  // With loss scaling: the current scale and the steps skipped so far (each
  // waits for the steps pushed before). Without: 1 and 0.
  float loss_scale() const;
  std::int64_t skipped_steps() const;

  // Gradient accumulation: while a NoSync is alive, backward() adds each
  // replica's weighted gradients into its buckets and pushes no
  // communication; the first backward() after it ends reduces them together
  // with its own (the sum over all those micro-batches), once.
  class NoSync {
   public:
    NoSync(NoSync&& other) noexcept : dp_(std::exchange(other.dp_, nullptr)) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
    ~NoSync();

   private:
    friend class DataParallel;
    explicit NoSync(DataParallel* dp) : dp_(dp) {}
    DataParallel* dp_;
  };
  NoSync no_sync();

  // The number of steps every process can take when this one has
  // `local_steps` batches: the smallest over all processes (waits for every
  // process: call it at the same point on each, e.g. at an epoch's start).
  // Uneven data then ends the epoch on every rank at once instead of
  // leaving one rank waiting in a collective.
  std::int64_t agree_steps(std::int64_t local_steps);

  // Replaces how buckets are reduced (nullptr: back to reduce_bucket).
  void set_reduction(BucketReduction reduction);
  // The default reduction: an allreduce-sum over every replica.
  void reduce_bucket(const GradientBucket& bucket);

  void train(bool on);  // every replica's training mode

 private:
  friend BucketReduction half_precision_reduction(DataParallel& dp, HalfReductionOptions options);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::parallel
