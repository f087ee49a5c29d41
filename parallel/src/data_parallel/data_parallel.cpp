// DataParallel (weft/parallel/data_parallel.h): the bucket plan, the
// interleaved backward that pushes each bucket's reduction as soon as its
// last gradient is pushed, and the reductions (one communicator over the
// replicas' devices, or through the host for a mix of CPU devices and GPUs).
// The optimizer step and ZeRO's stages: data_parallel_shard.cpp; checkpoints:
// data_parallel_checkpoint.cpp. Design notes: docs/design/data-parallel.md.
#include "weft/parallel/data_parallel.h"

#include "data_parallel/data_parallel_impl.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "weft/env.h"
#include "weft/error.h"
#include "weft/ops.h"

namespace weft::parallel {

namespace {

constexpr std::size_t kDefaultBucketBytes = std::size_t{25} << 20;

std::size_t bucket_bytes_from(const std::optional<std::size_t>& option) {
  if (option) return *option;
  return static_cast<std::size_t>(env::number_or("WEFT_BUCKET_BYTES", static_cast<long long>(kDefaultBucketBytes), 0,
                                                 std::numeric_limits<long long>::max(),
                                                 "a byte count (a whole number; 0: one bucket per parameter)"));
}

// The layers that run a backward of their own: a Sequential's children,
// recursively, in forward order.
void collect_leaves(nn::Layer& layer, std::vector<nn::Layer*>& out) {
  if (auto* seq = dynamic_cast<nn::Sequential*>(&layer)) {
    for (std::size_t i = 0; i < seq->size(); ++i) collect_leaves((*seq)[i], out);
    return;
  }
  out.push_back(&layer);
}

std::string kib(std::int64_t elements) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(elements) * 4.0 / 1024.0);
  return buf;
}

}  // namespace

std::vector<std::int64_t> split_rows(std::int64_t rows, int parts) {
  if (parts <= 0) throw InvalidArgument("split_rows: parts must be positive, got " + std::to_string(parts));
  if (rows < 0) throw InvalidArgument("split_rows: rows must not be negative, got " + std::to_string(rows));
  std::vector<std::int64_t> out(static_cast<std::size_t>(parts), rows / parts);
  for (std::int64_t i = 0; i < rows % parts; ++i) ++out[static_cast<std::size_t>(i)];
  return out;
}

void DataParallel::Impl::agree_max(std::vector<Tensor>& flags, const std::string& name) {
  if (!mixed) {
    if (comm) allreduce(*comm, flags, ReduceOp::max, {.name = name});
    return;
  }
  Tensor host = flags[0].copy_to(Device::cpu(0));
  // Flags are 0 or 1: a sum above 0 is the same verdict as the largest.
  for (std::size_t r = 1; r < flags.size(); ++r) host = ops::add(host, flags[r].copy_to(Device::cpu(0)));
  if (host_comm) {
    std::vector<Tensor> t{host};
    allreduce(*host_comm, t, ReduceOp::max, {.name = name});
  }
  for (Tensor& f : flags) f.copy_from(host);
}

void DataParallel::Impl::build_plan() {
  const std::size_t n_leaves = leaves[0].size();
  for (std::size_t l = n_leaves; l-- > 0;)
    for (std::size_t j = 0; j < params[0][l].size(); ++j) order.emplace_back(l, j);
  if (order.empty()) throw InvalidArgument(label() + ": the model has no parameters");
  // Stage 3: a bucket per leaf with parameters (a layer's parameters are
  // gathered and freed together); otherwise by capacity.
  const bool per_leaf = options.shard == Shard::parameters;
  std::int64_t in_bucket = 0;
  for (std::size_t pos = 0; pos < order.size(); ++pos) {
    const nn::Parameter& p = param(0, pos);
    if (p.value.dtype() != DType::float32)
      throw InvalidArgument(label() + ": parameter '" + p.name + "' is " + std::string(to_string(p.value.dtype())) +
                            "; data-parallel gradients are float32");
    shapes.push_back(p.value.shape());
    in_bucket += p.value.numel();
    const bool leaf_ends = pos + 1 == order.size() || order[pos + 1].first != order[pos].first;
    if (per_leaf ? leaf_ends
                 : static_cast<std::size_t>(in_bucket) * sizeof(float) >= bucket_bytes || pos + 1 == order.size()) {
      bucket_end.push_back(pos + 1);
      in_bucket = 0;
    }
  }
  leaf_bucket.assign(n_leaves, -1);
  if (per_leaf)
    for (std::size_t b = 0; b < bucket_end.size(); ++b) leaf_bucket[order[bucket_end[b] - 1].first] = static_cast<int>(b);
  // Ties: each tied parameter must be one of the model's; its bucket is
  // used (stage 3: gathered) by the tied layer too.
  leaf_uses.assign(n_leaves, {});
  for (std::size_t l = 0; l < n_leaves; ++l) {
    if (leaf_bucket[l] >= 0) leaf_uses[l].push_back(leaf_bucket[l]);
    for (const nn::Parameter* tied : leaves[0][l]->tied_parameters()) {
      std::size_t pos = 0;
      while (pos < order.size() && &param(0, pos) != tied) ++pos;
      if (pos == order.size())
        throw InvalidArgument(label() + ": layer " + std::to_string(l) + " (" + leaves[0][l]->describe() +
                              ") computes with parameter '" + tied->name + "', which no layer of the model owns");
      std::size_t b = 0;
      while (bucket_end[b] <= pos) ++b;
      if (per_leaf && std::find(leaf_uses[l].begin(), leaf_uses[l].end(), static_cast<int>(b)) == leaf_uses[l].end())
        leaf_uses[l].push_back(static_cast<int>(b));
    }
  }
  std::size_t begin = 0;
  for (std::size_t b = 0; b < bucket_end.size(); ++b) {
    GradientBucket bucket;
    bucket.index = static_cast<int>(b);
    for (std::size_t pos = begin; pos < bucket_end[b]; ++pos) {
      const nn::Parameter& p = param(0, pos);
      bucket.parameters.push_back(p.name);
      bucket.offsets.push_back(bucket.elements);
      bucket.elements += p.value.numel();
    }
    // Stages none and 1 keep the flat gradients (the replicas' grads are
    // views of them); stages 2 and 3 make them per step. Allocated by their
    // first pack (Tensor::empty): one device alone never packs.
    if (shard() <= Shard::optimizer)
      for (std::size_t r = 0; r < devices.size(); ++r)
        bucket.flat.push_back(Tensor::empty(*engine, Shape{bucket.elements}, devices[r])
                                  .set_role(MemoryRole::gradients)
                                  .set_name(options.name + " bucket " + std::to_string(b) + " on " + devices[r].str()));
    else
      bucket.flat.resize(devices.size());
    buckets.push_back(std::move(bucket));
    begin = bucket_end[b];
  }
}

// Replica r must have replica 0's layers and parameters (names, shapes).
void DataParallel::Impl::check_replica(std::size_t r) const {
  const std::string who = label() + ": replica " + std::to_string(r) + " on " + devices[r].str();
  if (leaves[r].size() != leaves[0].size())
    throw InvalidArgument(who + " has " + std::to_string(leaves[r].size()) + " layers but replica 0 has " +
                          std::to_string(leaves[0].size()) + " (the factory must build the same model)");
  for (std::size_t l = 0; l < leaves[0].size(); ++l) {
    const auto& mine = params[r][l];
    const auto& first = params[0][l];
    for (std::size_t j = 0; j < std::max(mine.size(), first.size()); ++j) {
      const nn::Parameter* a = j < first.size() ? first[j] : nullptr;
      const nn::Parameter* b = j < mine.size() ? mine[j] : nullptr;
      if (a && b && a->name == b->name && a->value.shape() == b->value.shape()) {
        if (b->value.device() != devices[r])
          throw InvalidArgument(who + ": parameter '" + b->name + "' is on " + b->value.device().str());
        continue;
      }
      const std::string theirs = a ? "'" + a->name + "' " + a->value.shape().str() : "nothing";
      const std::string ours = b ? "'" + b->name + "' " + b->value.shape().str() : "nothing";
      throw InvalidArgument(who + " differs from replica 0 in layer " + std::to_string(l) + " (" +
                            leaves[0][l]->describe() + "): it has " + ours + " where replica 0 has " + theirs +
                            " (the factory must build the same model)");
    }
  }
}

void DataParallel::Impl::reduce(const std::vector<Tensor>& flats, std::int64_t elements, const std::string& name,
                                bool broadcast_from_root) {
  if (!mixed) {
    if (!comm) return;  // one replica in all
    if (broadcast_from_root)
      broadcast(*comm, flats, {.name = name});
    else
      allreduce(*comm, flats, ReduceOp::sum, {.name = name});
    return;
  }
  // A mix of CPU devices and GPUs: through one host tensor.
  Tensor host = Tensor::empty(*engine, Shape{elements}, Device::cpu(0))
                    .set_role(MemoryRole::communication)
                    .set_name(name + " on the host");
  host.copy_from(flats[0]);
  if (!broadcast_from_root)
    for (std::size_t r = 1; r < flats.size(); ++r) ops::axpy(1.0f, flats[r].copy_to(Device::cpu(0)), host);
  if (host_comm) {
    if (broadcast_from_root)
      broadcast(*host_comm, {host}, {.name = name});
    else
      allreduce(*host_comm, {host}, ReduceOp::sum, {.name = name});
  }
  for (std::size_t r = broadcast_from_root && !host_comm ? 1 : 0; r < flats.size(); ++r) {
    Tensor flat = flats[r];  // a handle: the same storage
    flat.copy_from(host);
  }
}

void DataParallel::Impl::bind_views(std::size_t b, std::size_t r, const Tensor& flat) {
  const GradientBucket& bucket = buckets[b];
  for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
    const std::size_t pos = bucket_begin(b) + k;
    param(r, pos).value = flat.view(bucket.offsets[k], shapes[pos]);
  }
}

void DataParallel::Impl::flatten_parameters() {
  // One replica, unsharded: nothing gathers or broadcasts into them.
  if (shard() == Shard::none && world() == 1) return;
  param_flats.assign(buckets.size(), {});
  const bool chunked = shard() == Shard::parameters;
  if (chunked) initial_chunks.assign(buckets.size(), {});
  // Bucket by bucket: each bucket's flat tensor waits for the previous
  // bucket to be done (its pack; stage 3: its chunk cut), so the replicas'
  // own tensors are freed as the flat ones fill and a model needs its
  // parameters' memory once, not twice, while this runs.
  std::vector<Tensor> previous;
  for (const GradientBucket& bucket : buckets) {
    const auto b = static_cast<std::size_t>(bucket.index);
    for (std::size_t r = 0; r < devices.size(); ++r) {
      Tensor flat = Tensor::empty(*engine, Shape{bucket.elements}, devices[r])
                        .set_role(MemoryRole::parameters)
                        .set_name(options.name + " parameters " + std::to_string(b) + " on " + devices[r].str());
      if (!previous.empty())
        engine->push([] {}, devices[r], {previous[r].var()}, {flat.var()},
                     {.name = options.name + " parameters " + std::to_string(b) + " gate"});
      ops::pack(bucket_values(b, r), flat);
      param_flats[b].push_back(flat);
    }
    // The collective's name lists the bucket's parameters: across processes
    // the fingerprint check compares it, so ranks with different plans fail
    // here, naming both.
    if (world() > 1) {
      std::string name = options.name + " params bucket " + std::to_string(bucket.index) + ":";
      for (const std::string& p : bucket.parameters) name += " " + p;
      reduce(param_flats[b], bucket.elements, name, /*broadcast_from_root=*/true);
    }
    previous.clear();
    for (std::size_t r = 0; r < devices.size(); ++r) {
      if (chunked) {
        // The broadcast only reads the root's flat: an empty op that writes
        // it waits for the broadcast, and the cut after it, so the flat is
        // freed before the next one is taken.
        if (world() > 1)
          engine->push([] {}, devices[r], {}, {param_flats[b][r].var()},
                       {.name = options.name + " parameters " + std::to_string(b) + " broadcast done"});
        // Stage 3 keeps its chunk only: the flat goes once it is cut.
        const Chunk range = chunk(bucket.elements, world(), member(r));
        initial_chunks[b].push_back(ops::slice_rows(param_flats[b][r], range.begin, range.end)
                                        .set_role(MemoryRole::parameters));
        previous.push_back(initial_chunks[b].back());
        for (std::size_t pos = bucket_begin(b); pos < bucket_end[b]; ++pos) param(r, pos).value = Tensor();
      } else {
        // The layers' own tensors go (freed once packed): the views replace them.
        bind_views(b, r, param_flats[b][r]);
        previous.push_back(param_flats[b][r]);
      }
    }
    if (chunked) param_flats[b].clear();
  }
}

void DataParallel::Impl::check_options() const {
  if (options.prefetch_layers < 0 || static_cast<std::size_t>(options.prefetch_layers) > bucket_end.size())
    throw InvalidArgument(label() + ": prefetch_layers " + std::to_string(options.prefetch_layers) +
                          " is out of range [0, " + std::to_string(bucket_end.size()) +
                          "] (the model has that many layers with parameters)");
  if (const auto& host = options.offload) {
    if (host->is_gpu())
      throw InvalidArgument(label() + ": offload to " + host->str() +
                            ": the optimizer state is offloaded to a host device (cpu_pinned(0) or cpu(i)), not a GPU");
    const std::vector<Device> known = engine->devices();
    if (!(host->kind() == DeviceKind::cpu_pinned && host->index() == 0) &&
        std::find(known.begin(), known.end(), *host) == known.end())
      throw InvalidArgument(label() + ": offload to " + host->str() + ", which this engine does not have");
    if (!devices.front().is_gpu())
      throw InvalidArgument(label() + ": offload to " + host->str() + " with replicas on " + devices.front().str() +
                            ": the replicas' memory is host memory already (offload moves GPU members' state)");
    if (shard() == Shard::none)
      throw InvalidArgument(label() + ": offload to " + host->str() +
                            " moves each member's chunk of the optimizer state: it needs Shard::optimizer, "
                            "gradients or parameters, not none");
  }
}

std::vector<Tensor> DataParallel::Impl::bucket_values(std::size_t b, std::size_t r) const {
  std::vector<Tensor> values;
  for (std::size_t pos = bucket_begin(b); pos < bucket_end[b]; ++pos) values.push_back(param(r, pos).value);
  return values;
}

void DataParallel::Impl::finish_bucket(std::size_t b, bool sync, const std::vector<std::vector<bool>>& unused,
                                       const std::vector<Tensor>& next) {
  GradientBucket& bucket = buckets[b];
  const std::size_t begin = bucket_begin(b);
  const std::size_t end = bucket_end[b];
  // Stages 2 and 3: the flat bucket exists from the first pack to the
  // reduce-scatter, and the full gradients only until they are packed.
  const bool sharded_grads = shard() >= Shard::gradients;
  // One replica in all and nothing accumulated: the grads are final already.
  const bool direct = shard() == Shard::none && world() == 1 && accumulated == 0 && sync;
  for (std::size_t r = 0; r < devices.size(); ++r) {
    std::vector<Tensor> grads;
    for (std::size_t pos = begin; pos < end; ++pos) {
      nn::Parameter& p = param(r, pos);
      if (!unused[r][pos]) {
        grads.push_back(p.grad);
        continue;
      }
      Tensor& z = zeros[r][pos];
      if (!z.defined()) z = Tensor::zeros(*engine, shapes[pos], devices[r]);
      if (direct) p.grad = z;  // (never written: a new grad tensor comes with every reduction)
      grads.push_back(z);
    }
    if (direct) continue;
    Tensor& flat = bucket.flat[r];
    if (!flat.defined()) {  // stages 2 and 3: a communication buffer, from here to the reduce-scatter
      flat = Tensor::empty(*engine, Shape{bucket.elements}, devices[r])
                 .set_role(MemoryRole::communication)
                 .set_name(options.name + " bucket " + std::to_string(b) + " on " + devices[r].str());
      // One bucket in flight: its memory is taken once the previous
      // bucket's reduce-scatter is done with that one's.
      if (sync && in_flight)
        engine->push([] {}, devices[r], {bucket_done[r]}, {flat.var()},
                     {.name = options.name + " bucket " + std::to_string(b) + " pack gate", .property = kOrderingProperty});
    }
    ops::pack(grads, flat, static_cast<float>(weight[r]), /*accumulate=*/accumulated > 0);
    // ... and the next layers' backward (their new gradients) waits for this
    // pack, which frees the gradients it packed.
    if (r < next.size() && next[r].defined())
      engine->push([] {}, devices[r], {flat.var()}, {next[r].var()},
                   {.name = options.name + " bucket " + std::to_string(b) + " packed"});
    // Packed: stages 2 and 3 drop the layer's gradient tensors (stages none
    // and 1: views of the flat replace them once it is reduced).
    if (sharded_grads)
      for (std::size_t pos = begin; pos < end; ++pos) param(r, pos).grad = Tensor();
  }
  if (direct || !sync) return;
  if (sharded_grads) {
    reduce_scatter_bucket(b);
    return;
  }
  if (world() > 1) {
    // One reduction in flight (a collective may take a bucket-sized scratch
    // buffer: the in-process GPU ring does): it starts once the previous
    // bucket's is done, still beside the backward of the layers before.
    if (in_flight)
      for (std::size_t r = 0; r < devices.size(); ++r)
        engine->push([] {}, devices[r], {bucket_done[r]}, {bucket.flat[r].var()},
                     {.name = options.name + " bucket " + std::to_string(b) + " reduction gate",
                      .property = kOrderingProperty});
    if (reduction)
      reduction(bucket);
    else
      reduce(bucket.flat, bucket.elements, options.name + " bucket " + std::to_string(b), false);
  }
  for (std::size_t r = 0; r < devices.size(); ++r) {
    for (std::size_t k = 0; k < bucket.parameters.size(); ++k)
      param(r, begin + k).grad = bucket.flat[r].view(bucket.offsets[k], shapes[begin + k]);
    // Stage 1 under offload: this member's chunk of the reduced gradient to
    // the host, where its update runs.
    if (shard() == Shard::optimizer && offloaded()) {
      ShardSlot& slot = *slots[b][r];
      slot.param.grad.copy_from(bucket.flat[r].view(slot.range.begin, Shape{slot.range.size()}));
    }
  }
  if (world() > 1) mark_done(b, {});
}

DataParallel::Impl::~Impl() {
  for (const Var v : bucket_done) {
    try {
      engine->delete_var(v);  // after the ops that use it
    } catch (const std::exception& e) {
      std::fprintf(stderr, "weft: DataParallel: %s\n", e.what());
    }
  }
}

void DataParallel::Impl::mark_done(std::size_t b, const std::vector<Tensor>& also) {
  for (std::size_t r = 0; r < devices.size(); ++r) {
    if (bucket_done.size() < devices.size()) bucket_done.push_back(engine->new_var(options.name + " bucket done"));
    std::vector<Var> done{buckets[b].flat[r].var(), bucket_done[r]};
    if (r < also.size()) done.push_back(also[r].var());
    engine->push([] {}, devices[r], {}, done,
                 {.name = options.name + " bucket " + std::to_string(b) + " done", .property = kOrderingProperty});
  }
  in_flight = true;
}

// ---- DataParallel ---------------------------------------------------------------------

DataParallel::DataParallel(Engine& engine, std::vector<Device> devices, const ReplicaFactory& make_replica,
                           DataParallelOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.engine = &engine;
  m.options = std::move(options);
  m.bucket_bytes = bucket_bytes_from(m.options.bucket_bytes);
  if (devices.empty()) throw InvalidArgument("DataParallel: no devices");
  if (!make_replica) throw InvalidArgument("DataParallel: no replica factory");
  const std::vector<Device> known = engine.devices();
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const Device d = devices[i];
    if (!d.is_cpu() && !d.is_gpu())
      throw InvalidArgument("DataParallel: device " + std::to_string(i) + " is " + d.str() +
                            "; replicas live on CPU devices or GPUs");
    if (std::find(known.begin(), known.end(), d) == known.end())
      throw InvalidArgument("DataParallel: device " + std::to_string(i) + " is " + d.str() +
                            ", which this engine does not have");
    for (std::size_t j = 0; j < i; ++j)
      if (devices[j] == d)
        throw InvalidArgument("DataParallel: devices " + std::to_string(j) + " and " + std::to_string(i) +
                              " are both " + d.str());
    if (d.is_gpu() != devices.front().is_gpu()) m.mixed = true;
  }
  m.devices = std::move(devices);

  for (std::size_t r = 0; r < m.devices.size(); ++r) {
    std::unique_ptr<nn::Sequential> replica = make_replica(m.devices[r]);
    if (!replica)
      throw InvalidArgument("DataParallel: the factory returned no model for " + m.devices[r].str());
    std::vector<nn::Layer*> leaves;
    collect_leaves(*replica, leaves);
    std::vector<std::vector<nn::Parameter*>> params;
    for (nn::Layer* leaf : leaves) {
      std::vector<nn::Parameter*> p = leaf->parameters();
      std::stable_sort(p.begin(), p.end(), [](const nn::Parameter* a, const nn::Parameter* b) { return a->name < b->name; });
      params.push_back(std::move(p));
    }
    m.replicas.push_back(std::move(replica));
    m.leaves.push_back(std::move(leaves));
    m.params.push_back(std::move(params));
    if (r > 0) m.check_replica(r);
  }
  for (const auto& leaf_params : m.params[0])
    for (const nn::Parameter* p : leaf_params)
      if (p->value.device() != m.devices[0])
        throw InvalidArgument("DataParallel: replica 0's parameter '" + p->name + "' is on " +
                              p->value.device().str() + ", not " + m.devices[0].str());

  if (m.options.distributed) {
    if (m.mixed) {
      m.host_comm = Communicator::mpi(engine, Device::cpu(0), m.options.communicator);
      m.processes = m.host_comm->size();
      m.process_rank = m.host_comm->local_ranks().front();
    } else {
      m.comm = Communicator::mpi(engine, m.devices, m.options.communicator);
      m.processes = m.comm->size() / static_cast<int>(m.devices.size());
      m.process_rank = m.comm->local_ranks().front() / static_cast<int>(m.devices.size());
    }
  } else if (!m.mixed && m.devices.size() > 1) {
    m.comm = Communicator::local(engine, m.devices);
  }

  if (m.mixed && m.options.shard != Shard::none)
    throw InvalidArgument("DataParallel: Shard::" + std::string(to_string(m.options.shard)) +
                          " needs replicas on CPU devices only or GPUs only (a collective group); got a mix (" +
                          m.devices.front().str() + ", ...)");
  m.build_plan();
  m.check_options();
  m.zeros.assign(m.devices.size(), std::vector<Tensor>(m.order.size()));
  m.flatten_parameters();
  m.setup_optimizer();
  if (const auto& ls = m.options.loss_scaling) {
    if (!(ls->init_scale > 0.0f) || !std::isfinite(ls->init_scale))
      throw InvalidArgument("DataParallel: LossScaling::init_scale " + std::to_string(ls->init_scale) +
                            " must be a positive number");
    for (std::size_t r = 0; r < m.devices.size(); ++r) {
      const std::string at = " (replica " + std::to_string(r) + ")";
      m.scale.push_back(Tensor::full(engine, Shape{1}, ls->init_scale, m.devices[r]).set_name(m.options.name + " loss scale" + at));
      m.growth_tracker.push_back(Tensor::zeros(engine, Shape{1}, m.devices[r]).set_name(m.options.name + " growth tracker" + at));
      m.skipped.push_back(Tensor::zeros(engine, Shape{1}, m.devices[r]).set_name(m.options.name + " skipped steps" + at));
    }
  }
}

DataParallel::~DataParallel() = default;

Engine& DataParallel::engine() const noexcept { return *impl_->engine; }
const std::vector<Device>& DataParallel::devices() const noexcept { return impl_->devices; }
int DataParallel::replicas() const noexcept { return static_cast<int>(impl_->devices.size()); }
int DataParallel::world_size() const noexcept { return impl_->world(); }
int DataParallel::process_rank() const noexcept { return impl_->process_rank; }
int DataParallel::processes() const noexcept { return impl_->processes; }
const std::vector<GradientBucket>& DataParallel::buckets() const noexcept { return impl_->buckets; }
std::string DataParallel::comm_marker() const { return "'" + impl_->options.name + " bucket "; }
std::string DataParallel::offload_marker() const { return "[" + impl_->options.name + " offload]"; }

nn::Sequential& DataParallel::replica(int i) const {
  if (i < 0 || i >= replicas())
    throw InvalidArgument("DataParallel::replica: index " + std::to_string(i) + " out of range (" +
                          std::to_string(replicas()) + " replicas)");
  return *impl_->replicas[static_cast<std::size_t>(i)];
}

std::string DataParallel::describe_buckets() const {
  std::string out;
  for (const GradientBucket& b : impl_->buckets) {
    out += "bucket " + std::to_string(b.index) + ": " + std::to_string(b.elements) + " elements (" + kib(b.elements) +
           "):";
    for (const std::string& p : b.parameters) out += " " + p;
    out += "\n";
  }
  return out;
}

std::vector<Tensor> DataParallel::split_and_load(const Shape& shape, std::span<const float> data) {
  Impl& m = *impl_;
  if (shape.rank() == 0) throw InvalidArgument("DataParallel::split_and_load: a batch needs a row dimension, got shape []");
  if (static_cast<std::int64_t>(data.size()) != shape.numel())
    throw InvalidArgument("DataParallel::split_and_load: shape " + shape.str() + " holds " +
                          std::to_string(shape.numel()) + " values but the data has " + std::to_string(data.size()));
  const std::int64_t rows = shape[0];
  if (rows < m.world())
    throw InvalidArgument("DataParallel::split_and_load: a batch of " + std::to_string(rows) +
                          " rows cannot be split over " + std::to_string(m.world()) +
                          " replicas (each needs at least one row)");
  const std::int64_t row_size = rows > 0 ? shape.numel() / rows : 0;
  const std::vector<std::int64_t> parts = split_rows(rows, m.world());
  const std::size_t first = static_cast<std::size_t>(m.process_rank) * m.devices.size();
  std::int64_t begin = 0;
  for (std::size_t i = 0; i < first; ++i) begin += parts[i];
  std::vector<Tensor> out;
  m.split.clear();
  for (std::size_t r = 0; r < m.devices.size(); ++r) {
    const std::int64_t n = parts[first + r];
    std::vector<std::int64_t> dims = shape.dims();
    dims[0] = n;
    out.push_back(Tensor::from_host(*m.engine, Shape(std::move(dims)),
                                    data.subspan(static_cast<std::size_t>(begin * row_size),
                                                 static_cast<std::size_t>(n * row_size)),
                                    m.devices[r]));
    m.split.push_back(n);
    begin += n;
  }
  m.split_total = rows;
  return out;
}

std::vector<Tensor> DataParallel::forward(const std::vector<Tensor>& inputs) {
  Impl& m = *impl_;
  if (inputs.size() != m.devices.size())
    throw InvalidArgument("DataParallel::forward: " + std::to_string(inputs.size()) + " inputs for " +
                          std::to_string(m.devices.size()) + " replicas");
  std::int64_t local = 0;
  for (std::size_t r = 0; r < inputs.size(); ++r) {
    const Tensor& x = inputs[r];
    if (!x.defined()) throw InvalidArgument("DataParallel::forward: input " + std::to_string(r) + " is undefined");
    if (x.device() != m.devices[r])
      throw InvalidArgument("DataParallel::forward: input " + std::to_string(r) + " (" + x.str() + ") is not on " +
                            m.devices[r].str() + ", replica " + std::to_string(r) + "'s device");
    if (x.shape().rank() == 0 || x.shape()[0] == 0)
      throw InvalidArgument("DataParallel::forward: input " + std::to_string(r) + " (" + x.str() + ") has no rows");
    local += x.shape()[0];
  }
  // Weights: each replica's share of the whole batch's rows.
  bool from_split = m.split.size() == inputs.size();
  for (std::size_t r = 0; from_split && r < inputs.size(); ++r) from_split = m.split[r] == inputs[r].shape()[0];
  const double total = from_split ? static_cast<double>(m.split_total) : static_cast<double>(local) * m.processes;
  m.split.clear();
  m.weight.assign(inputs.size(), 0.0);
  std::vector<Tensor> out;
  for (std::size_t r = 0; r < inputs.size(); ++r) {
    m.weight[r] = static_cast<double>(inputs[r].shape()[0]) / total;
    if (m.shard() != Shard::parameters) out.push_back(m.replicas[r]->forward(inputs[r]));
  }
  if (m.shard() == Shard::parameters) return m.forward_sharded(inputs);
  return out;
}

void DataParallel::backward(const std::vector<Tensor>& output_grads) {
  Impl& m = *impl_;
  if (output_grads.size() != m.devices.size())
    throw InvalidArgument("DataParallel::backward: " + std::to_string(output_grads.size()) + " gradients for " +
                          std::to_string(m.devices.size()) + " replicas");
  if (m.weight.empty()) throw InvalidArgument("DataParallel::backward: no forward since the last backward");
  const bool sync = m.no_sync_depth == 0;
  std::vector<Tensor> d = output_grads;
  if (!m.scale.empty())
    for (std::size_t r = 0; r < d.size(); ++r) d[r] = ops::scale_by(d[r], m.scale[r]);
  std::vector<std::vector<bool>> unused(m.devices.size(), std::vector<bool>(m.order.size(), false));
  std::size_t ready = 0, next_bucket = 0;  // plan positions whose grads are pushed; the next bucket to reduce
  for (std::size_t l = m.leaves[0].size(); l-- > 0;) {
    const std::size_t n = m.params[0][l].size();
    // Stage 3: the layer's parameters gathered again (and the next layers'
    // gathers pushed ahead), and those it is tied to.
    const bool sharded = m.shard() == Shard::parameters;
    const int gathered = sharded ? m.leaf_bucket[l] : -1;
    if (sharded)
      for (int b : m.leaf_uses[l]) m.begin_use(static_cast<std::size_t>(b), d);
    // Interleave the replicas layer by layer, so each bucket's gradients are
    // pushed on every replica before the next layer's backward. Stage 3 runs
    // the two halves apart: the input gradient (which reads the gathered
    // parameters), the parameters freed, then the weight gradient (which
    // does not read them, and waits for the input gradient), so the layer's
    // gathered parameters and its new gradients are not held at once.
    std::vector<std::vector<Tensor>> before(m.devices.size());
    for (std::size_t r = 0; r < m.devices.size(); ++r) {
      for (const nn::Parameter* p : m.params[r][l]) before[r].push_back(p->grad);
      d[r] = gathered >= 0 ? m.leaves[r][l]->backward_input(d[r]) : m.leaves[r][l]->backward(d[r]);
    }
    if (sharded)
      for (int b : m.leaf_uses[l]) m.end_use(static_cast<std::size_t>(b));
    if (gathered >= 0) {
      for (std::size_t r = 0; r < m.devices.size(); ++r) {
        ops::WaitFor after_input_gradient(d[r].var());
        m.leaves[r][l]->backward_weight();
      }
    }
    for (std::size_t r = 0; r < m.devices.size(); ++r) {
      for (std::size_t j = 0; j < n; ++j) {
        const nn::Parameter& p = *m.params[r][l][j];
        if (p.grad.defined() && p.grad.storage() != before[r][j].storage()) {
          const Shape& shape = m.shapes[ready + j];
          if (p.grad.shape() != shape || p.grad.device() != m.devices[r])
            throw InvalidArgument("DataParallel::backward: the gradient of parameter '" + p.name + "' on replica " +
                                  std::to_string(r) + " is " + p.grad.str() + "; the parameter is " + shape.str() +
                                  " on " + m.devices[r].str());
          continue;
        }
        if (!m.options.allow_unused)
          throw InvalidArgument("DataParallel::backward: parameter '" + p.name + "' of replica " + std::to_string(r) +
                                " on " + m.devices[r].str() + " got no gradient from its layer (" +
                                m.leaves[r][l]->describe() +
                                "); if it is unused on purpose, set DataParallelOptions::allow_unused");
        unused[r][ready + j] = true;
      }
    }
    ready += n;
    if (!m.options.overlap) continue;
    while (next_bucket < m.bucket_end.size() && m.bucket_end[next_bucket] <= ready)
      m.finish_bucket(next_bucket++, sync, unused, d);
  }
  if (!m.options.overlap && m.world() > 1) {
    // The baseline without overlap: the engine would still start each
    // bucket's pack as soon as its gradients exist, whatever the push order;
    // an op that reads every gradient and writes every bucket holds all
    // packs until the whole backward has run.
    std::vector<Var> grads, flats;
    for (std::size_t r = 0; r < m.devices.size(); ++r) {
      for (std::size_t pos = 0; pos < m.order.size(); ++pos)
        if (!unused[r][pos]) grads.push_back(m.param(r, pos).grad.var());
      for (GradientBucket& bucket : m.buckets) {
        Tensor& flat = bucket.flat[r];
        if (!flat.defined())  // stages 2 and 3: packed into from here
          flat = Tensor::empty(*m.engine, Shape{bucket.elements}, m.devices[r])
                     .set_role(MemoryRole::communication)
                     .set_name(m.options.name + " bucket " + std::to_string(bucket.index) + " on " + m.devices[r].str());
        flats.push_back(flat.var());
      }
    }
    m.engine->push([] {}, Device::cpu(0), grads, flats, {.name = m.options.name + " backward done"});
  }
  while (next_bucket < m.bucket_end.size()) m.finish_bucket(next_bucket++, sync, unused);
  m.in_flight = false;
  m.weight.clear();
  m.accumulated = sync ? 0 : m.accumulated + 1;
}

float DataParallel::loss_scale() const {
  return impl_->scale.empty() ? 1.0f : impl_->scale[0].item();
}

std::int64_t DataParallel::skipped_steps() const {
  return impl_->skipped.empty() ? 0 : static_cast<std::int64_t>(impl_->skipped[0].item());
}

DataParallel::NoSync DataParallel::no_sync() {
  ++impl_->no_sync_depth;
  return NoSync(this);
}

DataParallel::NoSync::~NoSync() {
  if (dp_) --dp_->impl_->no_sync_depth;
}

std::int64_t DataParallel::agree_steps(std::int64_t local_steps) {
  Impl& m = *impl_;
  constexpr std::int64_t kExact = std::int64_t{1} << 24;  // carried as float32
  if (local_steps < 0 || local_steps >= kExact)
    throw InvalidArgument("DataParallel::agree_steps: " + std::to_string(local_steps) + " steps is out of range [0, " +
                          std::to_string(kExact) + ")");
  if (m.processes == 1) return local_steps;
  // The minimum as -max(-steps).
  const float v = -static_cast<float>(local_steps);
  std::vector<Tensor> t;
  if (m.host_comm) {
    t.push_back(Tensor::full(*m.engine, Shape{1}, v, Device::cpu(0)));
    allreduce(*m.host_comm, t, ReduceOp::max, {.name = m.options.name + " agree steps"});
  } else {
    for (Device d : m.devices) t.push_back(Tensor::full(*m.engine, Shape{1}, v, d));
    allreduce(*m.comm, t, ReduceOp::max, {.name = m.options.name + " agree steps"});
  }
  return -static_cast<std::int64_t>(t[0].item());
}

void DataParallel::set_reduction(BucketReduction reduction) {
  if (reduction && impl_->shard() >= Shard::gradients)
    throw InvalidArgument("DataParallel::set_reduction: with Shard::" + std::string(to_string(impl_->shard())) +
                          " the buckets are reduce-scattered (each member keeps its chunk), not reduced by a "
                          "replaceable allreduce; use Shard::none or Shard::optimizer");
  impl_->reduction = std::move(reduction);
}

void DataParallel::reduce_bucket(const GradientBucket& bucket) {
  impl_->reduce(bucket.flat, bucket.elements, impl_->options.name + " bucket " + std::to_string(bucket.index), false);
}

BucketReduction half_precision_reduction(DataParallel& dp, HalfReductionOptions options) {
  const std::string what = "half_precision_reduction";
  if (!is_half(options.dtype))
    throw InvalidArgument(what + ": dtype " + std::string(to_string(options.dtype)) +
                          " is not a half-precision type (bfloat16 or float16)");
  DataParallel::Impl& m = *dp.impl_;
  if (m.mixed)
    throw InvalidArgument(what + ": the replicas are on a mix of CPU devices and GPUs (" + m.devices.front().str() +
                          ", ...), whose gradients are summed through host memory; give it CPU devices or GPUs only");
  // residual[bucket][replica]: what the last cast dropped (error feedback).
  auto residual = std::make_shared<std::vector<std::vector<Tensor>>>(m.buckets.size());
  return [&m, options, residual](const GradientBucket& bucket) {
    if (!m.comm) return;  // one replica in all: nothing to send
    const std::string name = m.options.name + " bucket " + std::to_string(bucket.index) + " (" +
                             std::string(to_string(options.dtype)) + ")";
    std::vector<Tensor>& kept = (*residual)[static_cast<std::size_t>(bucket.index)];
    std::vector<Tensor> halves;
    for (std::size_t r = 0; r < bucket.flat.size(); ++r) {
      Tensor x = bucket.flat[r];
      if (options.error_feedback && r < kept.size()) x = ops::add(x, kept[r]);
      Tensor h = ops::cast(x, options.dtype).set_name(name + " on " + m.devices[r].str());
      if (options.error_feedback) {
        Tensor dropped = ops::sub(x, ops::cast(h, DType::float32)).set_name(name + " residual on " + m.devices[r].str());
        if (r < kept.size()) kept[r] = dropped;
        else kept.push_back(dropped);
      }
      halves.push_back(h);
    }
    allreduce(*m.comm, halves, ReduceOp::sum, {.name = name});
    for (std::size_t r = 0; r < bucket.flat.size(); ++r) {
      Tensor flat = bucket.flat[r];  // a handle: the same storage
      flat.copy_from(ops::cast(halves[r], DType::float32));
    }
  };
}

void DataParallel::train(bool on) {
  for (auto& replica : impl_->replicas) replica->train(on);
}

}  // namespace weft::parallel
