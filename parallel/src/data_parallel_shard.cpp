// DataParallel's optimizer step and ZeRO's stages (Shard): each member's
// chunk of every bucket, its optimizer, the reduce-scatter of the gradients
// (stages 2 and 3) and the all-gathers of the parameters (after the step in
// stages 1 and 2; before each layer's forward and backward in stage 3).
// Design notes: docs/design/data-parallel.md, "Sharding (ZeRO)".
#include <set>
#include <string>
#include <utility>

#include "data_parallel_impl.h"
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
      // Stage 3 keeps the chunk of the broadcast parameters (the flat bucket
      // holds them after broadcast_parameters); stages 1 and 2 cut it per
      // step, and the optimizer sees its shape here (never allocated).
      if (shard() == Shard::parameters) {
        if (world() == 1) {
          Tensor flat = bucket.flat[r];
          ops::pack(bucket_values(b, r), flat);
        }
        slot->param.value = ops::slice_rows(bucket.flat[r], slot->range.begin, slot->range.end);
      } else {
        slot->param.value = Tensor::empty(*engine, Shape{slot->range.size()}, devices[r]);
      }
      slot->param.value.set_name(slot->param.name);
      if (slot->range.size() > 0)
        slot->optimizer = std::make_unique<optim::Optimizer>(std::vector<nn::Parameter*>{&slot->param}, options.optimizer);
      if (shard() != Shard::parameters) slot->param.value = Tensor();
      slots[b].push_back(std::move(slot));
    }
    if (shard() >= Shard::gradients)
      for (Tensor& flat : bucket.flat) flat = Tensor();
  }
  gathered.resize(buckets.size());
  if (shard() == Shard::parameters)
    for (std::size_t b = 0; b < buckets.size(); ++b) release(b);
}

void DataParallel::Impl::gather(std::size_t b, const std::vector<Tensor>& chunks, const std::vector<Tensor>& out,
                                const std::string& what) {
  const std::string name = zero_bucket_name(options.name, b) + " " + what;
  if (comm) {
    all_gather(*comm, chunks, out, {.name = name});
    return;
  }
  Tensor whole = out[0];  // one member: its chunk is the whole bucket
  whole.copy_from(chunks[0]);
}

void DataParallel::Impl::reduce_scatter_bucket(std::size_t b) {
  GradientBucket& bucket = buckets[b];
  if (!comm) {  // one member: the flat bucket is its chunk
    ShardSlot& slot = *slots[b][0];
    slot.param.grad = bucket.flat[0].set_name(slot.param.name + ".grad");
    bucket.flat[0] = Tensor();
    return;
  }
  std::vector<Tensor> out;
  for (std::size_t r = 0; r < devices.size(); ++r) {
    ShardSlot& slot = *slots[b][r];
    slot.param.grad = Tensor::empty(*engine, Shape{slot.range.size()}, devices[r]).set_name(slot.param.name + ".grad");
    out.push_back(slot.param.grad);
  }
  reduce_scatter(*comm, bucket.flat, out, ReduceOp::sum, {.name = zero_bucket_name(options.name, b)});
  for (Tensor& flat : bucket.flat) flat = Tensor();
}

void DataParallel::Impl::prefetch(std::size_t b, const std::vector<Tensor>& after) {
  if (full_depth > 0 || !gathered[b].empty()) return;
  std::vector<Tensor> chunks, out;
  for (std::size_t r = 0; r < devices.size(); ++r) {
    chunks.push_back(slots[b][r]->param.value);
    out.push_back(Tensor::empty(*engine, Shape{buckets[b].elements}, devices[r])
                      .set_name(zero_bucket_name(options.name, b) + " parameters on " + devices[r].str()));
    // The gather depends on the chunks only, ready since the last step: by
    // itself it would run (and allocate) at once, every layer's together.
    // An empty op that reads `after` and writes the gathered tensor holds
    // it until the layer before it starts.
    if (!after.empty())
      engine->push([] {}, devices[r], {after[r].var()}, {out[r].var()},
                   {.name = zero_bucket_name(options.name, b) + " gather gate"});
  }
  gather(b, chunks, out, "gather");
  gathered[b] = std::move(out);
}

void DataParallel::Impl::materialize(std::size_t b) {
  if (full_depth > 0) return;  // FullParameters holds them already
  prefetch(b);
  std::vector<Tensor> flats = std::exchange(gathered[b], {});
  for (std::size_t r = 0; r < devices.size(); ++r) {
    std::vector<Tensor> values;
    for (std::size_t pos = bucket_begin(b); pos < bucket_end[b]; ++pos) {
      nn::Parameter& p = param(r, pos);
      p.value = Tensor::empty(*engine, shapes[pos], devices[r]).set_name(p.name);
      values.push_back(p.value);
    }
    ops::unpack(flats[r], values);
  }
}

void DataParallel::Impl::release(std::size_t b) {
  if (full_depth > 0) return;
  // Ops in flight keep the storage alive; the handles go.
  for (std::size_t r = 0; r < devices.size(); ++r)
    for (std::size_t pos = bucket_begin(b); pos < bucket_end[b]; ++pos) param(r, pos).value = Tensor();
}

std::vector<Tensor> DataParallel::Impl::forward_sharded(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> y = inputs;
  for (std::size_t r = 0; r < replicas.size(); ++r) replicas[r]->set_input_shape(inputs[r].shape());
  const std::size_t n_leaves = leaves[0].size();
  for (std::size_t l = 0; l < n_leaves; ++l) {
    const int b = leaf_bucket[l];
    if (b >= 0) {
      materialize(static_cast<std::size_t>(b));
      for (std::size_t k = l + 1; k < n_leaves; ++k)
        if (leaf_bucket[k] >= 0) {
          prefetch(static_cast<std::size_t>(leaf_bucket[k]), y);
          break;
        }
    }
    for (std::size_t r = 0; r < replicas.size(); ++r) y[r] = leaves[r][l]->forward(y[r]);
    if (b >= 0) release(static_cast<std::size_t>(b));
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
  // chunks of them.
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
  std::vector<Tensor> found, coefficient;
  if (!scale.empty()) {
    for (std::size_t r = 0; r < n; ++r)
      found.push_back(grads[r].empty() ? Tensor::zeros(*engine, Shape{1}, devices[r])
                                       : ops::unscale_and_check(grads[r], scale[r]));
    agree_max(found, options.name + " found inf");
  }
  if (options.max_grad_norm) {
    std::vector<Tensor> norm_sq;
    for (std::size_t r = 0; r < n; ++r)
      norm_sq.push_back(grads[r].empty() ? Tensor::zeros(*engine, Shape{1}, devices[r])
                                         : optim::grad_norm_squared(grads[r]).set_name(options.name + " grad norm^2"));
    // Sharded: each member summed its chunks; the norm is of all of them.
    if (shard() != Shard::none && comm) allreduce(*comm, norm_sq, ReduceOp::sum, {.name = options.name + " grad norm"});
    for (std::size_t r = 0; r < n; ++r) coefficient.push_back(optim::clip_coefficient(norm_sq[r], *options.max_grad_norm));
  }
  auto inputs = [&](std::size_t r) {
    optim::StepInputs in;
    if (!found.empty()) in.skip = {found[r]};
    if (!coefficient.empty()) in.grad_scale = {coefficient[r]};
    return in;
  };

  if (shard() == Shard::none) {
    for (std::size_t r = 0; r < n; ++r) optimizers[r]->step(lr, inputs(r));
  } else {
    for (std::size_t b = 0; b < slots.size(); ++b) {
      // Stages 1 and 2: the chunk of the parameters is cut from the
      // replica's (all equal), updated, and gathered back into every
      // replica's parameters through a flat bucket (stage 1: the bucket's
      // own, its gradients unpacked already).
      std::vector<Tensor> flats, chunks;
      for (std::size_t r = 0; r < n; ++r) {
        ShardSlot& slot = *slots[b][r];
        if (shard() != Shard::parameters) {
          Tensor flat = buckets[b].flat[r];
          if (shard() == Shard::gradients) {
            flat = Tensor::empty(*engine, Shape{buckets[b].elements}, devices[r])
                       .set_name(zero_bucket_name(options.name, b) + " parameters on " + devices[r].str());
            // The parameters are ready long before: held until the
            // bucket's gradient is, the flat bucket lives for the update only.
            engine->push([] {}, devices[r], {slot.param.grad.var()}, {flat.var()},
                         {.name = zero_bucket_name(options.name, b) + " update gate"});
          }
          ops::pack(bucket_values(b, r), flat);
          slot.param.value = ops::slice_rows(flat, slot.range.begin, slot.range.end).set_name(slot.param.name);
          flats.push_back(flat);
        }
        if (slot.optimizer) slot.optimizer->step(lr, inputs(r));
        chunks.push_back(slot.param.value);
      }
      if (shard() == Shard::parameters) continue;
      gather(b, chunks, flats, "gather");
      for (std::size_t r = 0; r < n; ++r) {
        ops::unpack(flats[r], bucket_values(b, r));
        ShardSlot& slot = *slots[b][r];
        slot.param.value = Tensor();
        // Stage 1: the chunk was a copy of the full gradients, which stay.
        if (shard() == Shard::optimizer) slot.param.grad = Tensor();
      }
    }
    // Stage 3 with FullParameters alive: the full parameters follow the step.
    if (shard() == Shard::parameters && full_depth > 0) {
      const int depth = std::exchange(full_depth, 0);
      for (std::size_t b = 0; b < buckets.size(); ++b) materialize(b);
      full_depth = depth;
    }
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
    std::set<const void*> seen;  // each storage once (shared zeros, reshapes)
    std::size_t bytes = 0;
    auto add = [&](const Tensor& t) {
      if (t.defined() && seen.insert(t.storage().get()).second) bytes += t.nbytes();
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
        if (slot.optimizer)
          for (nn::Buffer* s : slot.optimizer->state()) add(s->value);
      }
    }
    out.push_back(bytes);
  }
  return out;
}

DataParallel::FullParameters DataParallel::full_parameters() {
  Impl& m = *impl_;
  if (m.shard() == Shard::parameters && m.full_depth == 0)
    for (std::size_t b = 0; b < m.buckets.size(); ++b) m.materialize(b);
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
