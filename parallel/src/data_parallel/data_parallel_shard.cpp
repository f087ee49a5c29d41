// DataParallel's optimizer step and ZeRO's stages (Shard): each member's
// chunk of every bucket, its optimizer, the reduce-scatter of the gradients
// (stages 2 and 3) and the all-gathers of the parameters (after the step in
// stages 1 and 2; before each layer's forward and backward in stage 3).
// Design notes: docs/design/data-parallel.md, "Sharding (ZeRO)".
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "data_parallel/data_parallel_impl.h"
#include "weft/error.h"
#include "weft/ops.h"

namespace weft::parallel {

std::string_view to_string(Shard shard) noexcept {
  switch (shard) {
    case Shard::none: return "none";
    case Shard::optimizer: return "optimizer";
    case Shard::gradients: return "gradients";
    case Shard::parameters: return "parameters";
  }
  return "?";
}

Shard parse_shard(std::string_view text, std::string_view what) {
  for (Shard s : {Shard::none, Shard::optimizer, Shard::gradients, Shard::parameters})
    if (text == to_string(s) || (text.size() == 1 && text[0] == static_cast<char>('0' + static_cast<int>(s)))) return s;
  throw InvalidArgument(std::string(what) + ": '" + std::string(text) +
                        "' is not a shard setting (none, optimizer, gradients, parameters, or 0..3)");
}

namespace {

std::string zero_bucket_name(const std::string& prefix, std::size_t b) { return prefix + " bucket " + std::to_string(b); }

}  // namespace

void DataParallel::Impl::setup_optimizer() {
  options.optimizer.validate(label() + " optimizer");
  if (shard() == Shard::none) {
    for (auto& replica : replicas)
      optimizers.push_back(std::make_unique<optim::Optimizer>(replica->parameters(), options.optimizer));
    return;
  }
  const int n = world();
  slots.resize(buckets.size());
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    GradientBucket& bucket = buckets[b];
    for (std::size_t r = 0; r < devices.size(); ++r) {
      auto slot = std::make_unique<ShardSlot>();
      const int me = member(r);
      slot->range = chunk(bucket.elements, n, me);
      slot->param.name = zero_bucket_name(options.name, b) + " chunk " + std::to_string(me);
      // Stages 1 and 2: the chunk of the replica's flat parameters itself (the
      // step updates it in place and gathers the others' into the rest);
      // stage 3 keeps the chunk flatten_parameters cut.
      Tensor value = shard() == Shard::parameters
                         ? initial_chunks[b][r]
                         : param_flats[b][r].view(slot->range.begin, Shape{slot->range.size()});
      if (offloaded()) {
        slot->device_value = value;
        slot->param.value = value.copy_to(*options.offload).set_role(MemoryRole::parameters);
        slot->param.grad = Tensor::empty(*engine, Shape{slot->range.size()}, *options.offload)
                               .set_role(MemoryRole::gradients)
                               .set_name(slot->param.name + ".grad");
      } else {
        slot->param.value = value;
        // Stage 1: the chunk of the flat gradient, reduced in place.
        if (shard() == Shard::optimizer)
          slot->param.grad = bucket.flat[r].view(slot->range.begin, Shape{slot->range.size()});
      }
      if (shard() == Shard::parameters || offloaded()) slot->param.value.set_name(slot->param.name);
      if (slot->range.size() > 0) {
        // Its state is taken once the chunk exists, as the bucket's
        // parameters are flattened (not all at once, beside them).
        ops::WaitFor after_chunk(value.var());
        slot->optimizer = std::make_unique<optim::Optimizer>(std::vector<nn::Parameter*>{&slot->param}, options.optimizer);
      }
      slots[b].push_back(std::move(slot));
    }
  }
  gathered.resize(buckets.size());
  initial_chunks.clear();
}

void DataParallel::Impl::gather(std::size_t b, const std::vector<Tensor>& chunks, const std::vector<Tensor>& out,
                                const std::string& what) {
  const std::string name = zero_bucket_name(options.name, b) + " " + what;
  if (comm) {
    all_gather(*comm, chunks, out, {.name = name});
    return;
  }
  Tensor whole = out[0];  // one member: its chunk is the whole bucket (in place: nothing to do)
  whole.copy_from(chunks[0]);
}

void DataParallel::Impl::reduce_scatter_bucket(std::size_t b) {
  GradientBucket& bucket = buckets[b];
  std::vector<Tensor> out;
  if (!comm) {  // one member: the flat bucket is its chunk
    out.push_back(bucket.flat[0].set_role(MemoryRole::gradients));
  } else {
    for (std::size_t r = 0; r < devices.size(); ++r)
      out.push_back(Tensor::empty(*engine, Shape{slots[b][r]->range.size()}, devices[r])
                        .set_role(MemoryRole::gradients)
                        .set_name(slots[b][r]->param.name + ".grad"));
    reduce_scatter(*comm, bucket.flat, out, ReduceOp::sum, {.name = zero_bucket_name(options.name, b)});
  }
  for (std::size_t r = 0; r < devices.size(); ++r) {
    ShardSlot& slot = *slots[b][r];
    if (offloaded())  // to the host at once: the update may start; the GPU's chunk goes
      slot.param.grad.copy_from(out[r]);
    else
      slot.param.grad = out[r].set_name(slot.param.name + ".grad");
  }
  // What the next bucket's pack waits for: the reduce-scatter and (offloaded)
  // the copy done with the flat and the GPU's chunk.
  mark_done(b, offloaded() ? out : std::vector<Tensor>{});
  for (Tensor& flat : bucket.flat) flat = Tensor();
}

const Tensor& DataParallel::Impl::chunk_value(std::size_t b, std::size_t r) const {
  const ShardSlot& slot = *slots[b][r];
  return offloaded() ? slot.device_value : slot.param.value;
}

void DataParallel::Impl::gather_bucket(std::size_t b, const std::vector<Tensor>& after) {
  if (!gathered[b].empty()) return;
  std::vector<Tensor> chunks, out;
  for (std::size_t r = 0; r < devices.size(); ++r) {
    chunks.push_back(chunk_value(b, r));
    out.push_back(Tensor::empty(*engine, Shape{buckets[b].elements}, devices[r])
                      .set_role(MemoryRole::parameters)
                      .set_name(zero_bucket_name(options.name, b) + " parameters on " + devices[r].str()));
    // The gather depends on the chunks only, ready since the last step: by
    // itself it would run (and take its memory) at once, every layer's
    // together. An empty op that reads `after` and writes the gathered
    // tensor holds it until that layer is about to start.
    if (!after.empty())
      engine->push([] {}, devices[r], {after[r].var()}, {out[r].var()},
                   {.name = zero_bucket_name(options.name, b) + " gather gate"});
  }
  gather(b, chunks, out, "gather");
  gathered[b] = std::move(out);
}

void DataParallel::Impl::begin_use(std::size_t b, const std::vector<Tensor>& start) {
  if (next_use >= uses.size() || uses[next_use] != static_cast<int>(b))
    throw InvalidArgument(label() + ": layers ran out of the order forward() planned (a backward without its "
                          "forward, or a forward while another is being differentiated)");
  if (full_depth == 0) {
    gather_bucket(b, start);
    const std::size_t ahead = static_cast<std::size_t>(options.prefetch_layers);
    for (std::size_t k = next_use + 1; k < uses.size() && k <= next_use + ahead; ++k)
      gather_bucket(static_cast<std::size_t>(uses[k]), start);
  }
  for (std::size_t r = 0; r < devices.size(); ++r) bind_views(b, r, gathered[b][r]);
}

void DataParallel::Impl::end_use(std::size_t b) {
  const std::size_t used = next_use++;
  if (full_depth > 0) return;
  // Needed again within the window gathered ahead (the last layer's
  // forward and then its backward): kept.
  const std::size_t ahead = static_cast<std::size_t>(options.prefetch_layers);
  for (std::size_t k = used + 1; k < uses.size() && k <= used + ahead; ++k)
    if (uses[k] == static_cast<int>(b)) {
      for (std::size_t r = 0; r < devices.size(); ++r)
        for (std::size_t pos = bucket_begin(b); pos < bucket_end[b]; ++pos) param(r, pos).value = Tensor();
      return;
    }
  release(b);
}

void DataParallel::Impl::release(std::size_t b) {
  // Ops in flight keep the storage alive; the handles go.
  for (std::size_t r = 0; r < devices.size(); ++r)
    for (std::size_t pos = bucket_begin(b); pos < bucket_end[b]; ++pos) param(r, pos).value = Tensor();
  gathered[b].clear();
}

void DataParallel::Impl::gather_all() {
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    release(b);
    gather_bucket(b, {});
    for (std::size_t r = 0; r < devices.size(); ++r) bind_views(b, r, gathered[b][r]);
  }
}

std::vector<Tensor> DataParallel::Impl::forward_sharded(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> y = inputs;
  for (std::size_t r = 0; r < replicas.size(); ++r) replicas[r]->set_input_shape(inputs[r].shape());
  const std::size_t n_leaves = leaves[0].size();
  // This step's order of uses: the forward, then (training) the backward.
  if (full_depth == 0)
    for (std::size_t b = 0; b < buckets.size(); ++b) release(b);  // a forward that was never differentiated
  uses.clear();
  next_use = 0;
  for (std::size_t l = 0; l < n_leaves; ++l) uses.insert(uses.end(), leaf_uses[l].begin(), leaf_uses[l].end());
  if (replicas[0]->training())
    for (std::size_t l = n_leaves; l-- > 0;) uses.insert(uses.end(), leaf_uses[l].begin(), leaf_uses[l].end());
  for (std::size_t l = 0; l < n_leaves; ++l) {
    for (int b : leaf_uses[l]) begin_use(static_cast<std::size_t>(b), y);
    for (std::size_t r = 0; r < replicas.size(); ++r) y[r] = leaves[r][l]->forward(y[r]);
    for (int b : leaf_uses[l]) end_use(static_cast<std::size_t>(b));
  }
  return y;
}

void DataParallel::Impl::step(float lr) {
  if (accumulated > 0)
    throw InvalidArgument("DataParallel::step: the last " + std::to_string(accumulated) +
                          " backward()s ran inside no_sync and are not reduced yet; run one backward() outside "
                          "no_sync first");
  const std::size_t n = devices.size();
  // What each member's optimizer reads: its replica's gradients, or its
  // chunks of them (on the host, under offload).
  std::vector<std::vector<Tensor>> grads(n);
  for (std::size_t r = 0; r < n; ++r) {
    if (shard() == Shard::none) {
      for (nn::Parameter* p : replicas[r]->parameters())
        if (p->grad.defined()) grads[r].push_back(p->grad);
      continue;
    }
    for (std::size_t b = 0; b < slots.size(); ++b) {
      const ShardSlot& slot = *slots[b][r];
      if (slot.range.size() == 0) continue;
      if (!slot.param.grad.defined())
        throw InvalidArgument("DataParallel::step: no reduced gradient for '" + slot.param.name +
                              "' (run backward() before step())");
      grads[r].push_back(slot.param.grad);
    }
  }
  // Under offload the gradients are on the host: the verdicts are computed
  // there, agreed on the members' devices, and brought back.
  auto on_member = [&](const Tensor& t, std::size_t r) { return offloaded() ? t.copy_to(devices[r]) : t; };
  auto for_update = [&](const Tensor& t) { return offloaded() ? t.copy_to(*options.offload) : t; };
  std::vector<Tensor> found, coefficient;
  if (!scale.empty()) {
    for (std::size_t r = 0; r < n; ++r)
      found.push_back(grads[r].empty() ? Tensor::zeros(*engine, Shape{1}, devices[r])
                                       : on_member(ops::unscale_and_check(grads[r], for_update(scale[r])), r));
    agree_max(found, options.name + " found inf");
  }
  if (options.max_grad_norm) {
    std::vector<Tensor> norm_sq;
    for (std::size_t r = 0; r < n; ++r)
      norm_sq.push_back(grads[r].empty()
                            ? Tensor::zeros(*engine, Shape{1}, devices[r])
                            : on_member(optim::grad_norm_squared(grads[r]).set_name(options.name + " grad norm^2"), r));
    // Sharded: each member summed its chunks; the norm is of all of them.
    if (shard() != Shard::none && comm) allreduce(*comm, norm_sq, ReduceOp::sum, {.name = options.name + " grad norm"});
    for (std::size_t r = 0; r < n; ++r) coefficient.push_back(optim::clip_coefficient(norm_sq[r], *options.max_grad_norm));
  }
  std::vector<optim::StepInputs> inputs(n);
  for (std::size_t r = 0; r < n; ++r) {
    if (!found.empty()) inputs[r].skip = {for_update(found[r])};
    if (!coefficient.empty()) inputs[r].grad_scale = {for_update(coefficient[r])};
  }

  if (shard() == Shard::none) {
    for (std::size_t r = 0; r < n; ++r) optimizers[r]->step(lr, inputs[r]);
  } else {
    for (std::size_t b = 0; b < slots.size(); ++b) {
      std::vector<Tensor> chunks;
      for (std::size_t r = 0; r < n; ++r) {
        ShardSlot& slot = *slots[b][r];
        if (slot.optimizer) {
          // Offload: the update on the host's workers, named so
          // (offload_marker) for gpu_overlap.
          std::optional<ops::PushScope> named;
          if (offloaded()) named.emplace(0, options.name + " offload");
          slot.optimizer->step(lr, inputs[r]);
        }
        // Offload: the updated chunk back to the GPU (ahead of the gathers
        // of the next forward).
        if (offloaded() && slot.range.size() > 0) slot.device_value.copy_from(slot.param.value);
        chunks.push_back(chunk_value(b, r));
      }
      // Stages 1 and 2: every member's updated chunk into every replica's
      // flat parameters, in place (the chunks are views of them).
      if (shard() != Shard::parameters) gather(b, chunks, param_flats[b], "gather");
    }
    // Stage 3 with FullParameters alive: the full parameters follow the step.
    if (shard() == Shard::parameters && full_depth > 0) gather_all();
  }
  for (std::size_t r = 0; r < n && !scale.empty(); ++r)
    ops::update_loss_scale(scale[r], growth_tracker[r], skipped[r], found[r], options.loss_scaling->rule);
  ++steps;
}

// ---- DataParallel ----------------------------------------------------------------

void DataParallel::step() { impl_->step(impl_->options.optimizer.lr); }
void DataParallel::step(float lr) { impl_->step(lr); }
std::int64_t DataParallel::steps() const noexcept { return impl_->steps; }
const optim::OptimizerOptions& DataParallel::optimizer() const noexcept { return impl_->options.optimizer; }

std::vector<std::size_t> DataParallel::state_bytes() const {
  Impl& m = *impl_;
  std::vector<std::size_t> out;
  for (std::size_t r = 0; r < m.devices.size(); ++r) {
    // Each storage's bytes once, however many views of it are held: the
    // union of their element ranges.
    std::map<const void*, std::vector<std::pair<std::size_t, std::size_t>>> ranges;
    auto add = [&](const Tensor& t) {
      if (!t.defined() || t.device() != m.devices[r]) return;
      const std::size_t begin = static_cast<std::size_t>(t.storage_offset()) * dtype_size(t.dtype());
      ranges[t.storage().get()].emplace_back(begin, begin + t.nbytes());
    };
    for (nn::Parameter* p : m.replicas[r]->parameters()) {
      add(p->value);
      add(p->grad);
    }
    if (m.shard() == Shard::none) {
      for (nn::Buffer* s : m.optimizers[r]->state()) add(s->value);
    } else {
      for (auto& bucket_slots : m.slots) {
        ShardSlot& slot = *bucket_slots[r];
        add(slot.param.value);
        add(slot.param.grad);
        add(slot.device_value);
        if (slot.optimizer)
          for (nn::Buffer* s : slot.optimizer->state()) add(s->value);
      }
    }
    std::size_t bytes = 0;
    for (auto& [storage, spans] : ranges) {
      std::sort(spans.begin(), spans.end());
      std::size_t reach = 0;
      for (const auto& [begin, end] : spans) {
        if (end <= reach) continue;
        bytes += end - std::max(begin, reach);
        reach = end;
      }
    }
    out.push_back(bytes);
  }
  return out;
}

DataParallel::FullParameters DataParallel::full_parameters() {
  Impl& m = *impl_;
  if (m.shard() == Shard::parameters && m.full_depth == 0) m.gather_all();
  ++m.full_depth;
  return FullParameters(this);
}

DataParallel::FullParameters::~FullParameters() {
  if (!dp_) return;
  Impl& m = *dp_->impl_;
  if (--m.full_depth == 0 && m.shard() == Shard::parameters)
    for (std::size_t b = 0; b < m.buckets.size(); ++b) m.release(b);
}

}  // namespace weft::parallel
