// DataParallel's checkpoints (weft/checkpoint.h): the training state named
// as an unsharded one-device model names it, whatever the shard setting;
// replicated tensors from process 0's replica 0, sharded ones as pieces
// (flat element ranges of the parameter-shaped whole) from the members that
// own them. Loading reads any such checkpoint into this configuration.
// Design notes: docs/design/data-parallel.md, "Checkpoints".
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <random>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "data_parallel/data_parallel_impl.h"
#include "weft/error.h"
#include "weft/ops.h"

namespace weft::parallel {

namespace {

const char* const kLossScaleNames[] = {"loss_scale.scale", "loss_scale.growth_tracker", "loss_scale.skipped"};

// The state tensor `s` of a sharded slot's optimizer (state() lists them in
// state_names() order for its single parameter).
nn::Buffer& ckpt_slot_state(ShardSlot& slot, std::size_t s) { return *slot.optimizer->state()[s]; }

}  // namespace

std::vector<ChunkPiece> DataParallel::Impl::chunk_pieces(std::size_t b, const Chunk& range) const {
  std::vector<ChunkPiece> out;
  const GradientBucket& bucket = buckets[b];
  for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
    const std::int64_t first = bucket.offsets[k];
    const std::int64_t last = first + shapes[bucket_begin(b) + k].numel();
    const std::int64_t lo = std::max(first, range.begin), hi = std::min(last, range.end);
    if (lo < hi) out.push_back({bucket_begin(b) + k, lo - first, hi - first, lo - range.begin});
  }
  return out;
}

checkpoint::PendingSave DataParallel::save_checkpoint(const std::filesystem::path& dir, checkpoint::Metadata metadata,
                                                      const std::filesystem::path& run_dir, int keep) {
  Impl& m = *impl_;
  if (m.accumulated > 0)
    throw InvalidArgument("DataParallel::save_checkpoint: " + std::to_string(m.accumulated) +
                          " backward()s inside no_sync are not reduced yet; save after a step");
  if (keep < 1)
    throw InvalidArgument("DataParallel::save_checkpoint: keep (--keep-checkpoints) is " + std::to_string(keep) +
                          ": a run directory keeps at least its newest checkpoint (1 or more)");
  const bool writer0 = m.process_rank == 0;
  // Process 0 holds the run directory (and has cleaned what a crashed run
  // left there) before any process writes into it: the agreement below
  // comes after.
  if (writer0 && !run_dir.empty()) checkpoint::lock_run(run_dir);
  // A new identity for a save, the same on every process: process 0's random
  // bits, spread by an allreduce (max; the others give 0) of 24-bit values,
  // which float32 carries exactly.
  auto agree_save_id = [&m]() -> std::string {
    constexpr int kParts = 4;  // 96 bits
    std::vector<float> bits(kParts, 0.0f);
    if (m.process_rank == 0) {
      static std::mt19937_64 rng = [] {
        std::random_device device;
        std::seed_seq seq{device(), device(), device(), device(),
                          static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count())};
        return std::mt19937_64(seq);
      }();
      for (float& b : bits) b = static_cast<float>(rng() & 0xffffffu);
    }
    if (m.processes > 1) {
      std::vector<Tensor> t;
      const std::string name = m.options.name + " agree the checkpoint's identity";
      if (m.host_comm) {
        t.push_back(Tensor::from_host(*m.engine, Shape{kParts}, bits, Device::cpu(0)));
        allreduce(*m.host_comm, t, ReduceOp::max, {.name = name});
      } else {
        for (Device d : m.devices) t.push_back(Tensor::from_host(*m.engine, Shape{kParts}, bits, d));
        allreduce(*m.comm, t, ReduceOp::max, {.name = name});
      }
      bits = t[0].to_host();
    }
    std::string id = "dp";
    char buf[16];
    for (float b : bits) {
      std::snprintf(buf, sizeof buf, "%06x", static_cast<unsigned>(b));
      id += buf;
    }
    return id;
  };
  const std::string save_id = agree_save_id();
  const std::vector<std::string> states = m.options.optimizer.state_names();
  std::vector<checkpoint::Entry> entries;
  auto whole = [&](const std::string& name, const Tensor& t) { entries.push_back({.name = name, .tensor = t}); };

  // Parameters.
  if (m.shard() != Shard::parameters) {
    if (writer0)
      for (std::size_t pos = 0; pos < m.order.size(); ++pos) whole(m.param(0, pos).name, m.param(0, pos).value);
  }
  // Buffers (per replica: replica 0's) and the loss scaler.
  if (writer0) {
    for (nn::Buffer* buf : m.replicas[0]->buffers()) whole(buf->name, buf->value);
    if (!m.scale.empty()) {
      whole(kLossScaleNames[0], m.scale[0]);
      whole(kLossScaleNames[1], m.growth_tracker[0]);
      whole(kLossScaleNames[2], m.skipped[0]);
    }
  }
  // Optimizer state (and stage 3's parameters): whole from replica 0, or
  // each member's pieces.
  if (m.shard() == Shard::none) {
    if (writer0)
      for (nn::Buffer* s : m.optimizers[0]->state()) whole(s->name, s->value);
  } else {
    const std::size_t step_index = states.size();  // "step" is the last state, when there is one
    bool steps_written = false;
    for (std::size_t b = 0; b < m.buckets.size(); ++b)
      for (std::size_t r = 0; r < m.devices.size(); ++r) {
        ShardSlot& slot = *m.slots[b][r];
        if (!slot.optimizer) continue;
        for (const ChunkPiece& piece : m.chunk_pieces(b, slot.range)) {
          const std::string& pname = m.param(0, piece.pos).name;
          const Shape& shape = m.shapes[piece.pos];
          auto cut = [&](const Tensor& chunk) { return ops::slice_rows(chunk, piece.at, piece.at + piece.end - piece.begin); };
          if (m.shard() == Shard::parameters)
            entries.push_back({.name = pname, .tensor = cut(slot.param.value), .shape = shape, .begin = piece.begin,
                               .end = piece.end});
          for (std::size_t s = 0; s < states.size(); ++s) {
            if (states[s] == "step") continue;
            entries.push_back({.name = pname + "." + states[s], .tensor = cut(ckpt_slot_state(slot, s).value),
                               .shape = shape, .begin = piece.begin, .end = piece.end});
          }
        }
        // Every parameter's step count is every slot's (a step updates all
        // or, skipped, none): process 0 writes them from its first slot.
        if (writer0 && !steps_written && step_index > 0 && states.back() == "step") {
          for (std::size_t pos = 0; pos < m.order.size(); ++pos)
            whole(m.param(0, pos).name + ".step", ckpt_slot_state(slot, step_index - 1).value);
          steps_written = true;
        }
      }
  }
  metadata["weft.steps"] = std::to_string(m.steps);
  metadata["weft.shard"] = std::string(to_string(m.shard()));
  metadata["weft.members"] = std::to_string(m.world());
  metadata["weft.optimizer"] = m.options.optimizer.str();
  checkpoint::SaveOptions options;
  options.rank = m.process_rank;
  options.ranks = m.processes;
  options.metadata = std::move(metadata);
  options.run_dir = run_dir;
  options.keep = keep;
  options.save_id = save_id;
  return checkpoint::save(*m.engine, dir, std::move(entries), options);
}

void DataParallel::load_checkpoint(const checkpoint::Reader& reader) {
  Impl& m = *impl_;
  const std::string who = "DataParallel::load_checkpoint: " + reader.path().string();
  const std::vector<std::string> states = m.options.optimizer.state_names();

  // What this configuration holds, named as the unsharded model names it,
  // with each tensor's whole shape: every one must be in the checkpoint, and
  // nothing else may be.
  std::map<std::string, Shape> expected;
  for (std::size_t pos = 0; pos < m.order.size(); ++pos) {
    const std::string& name = m.param(0, pos).name;
    expected[name] = m.shapes[pos];
    for (const std::string& s : states) expected[name + "." + s] = s == "step" ? Shape{1} : m.shapes[pos];
  }
  for (nn::Buffer* buf : m.replicas[0]->buffers()) expected[buf->name] = buf->value.shape();
  if (!m.scale.empty())
    for (const char* name : kLossScaleNames) expected[name] = Shape{1};
  for (const auto& [name, shape] : expected) {
    if (!reader.has(name))
      throw InvalidArgument(who + ": key '" + name + "' is missing (this model and optimizer, " +
                            m.options.optimizer.str() + (m.scale.empty() ? "" : ", with loss scaling") +
                            ", need it)");
    if (reader.shape(name) != shape)
      throw InvalidArgument(who + ": key '" + name + "' has shape " + reader.shape(name).str() + " but this model's is " +
                            shape.str());
    if (reader.dtype(name) != DType::float32)
      throw InvalidArgument(who + ": key '" + name + "' is " + std::string(to_string(reader.dtype(name))) +
                            "; this model's is float32");
  }
  for (const std::string& name : reader.names())
    if (!expected.count(name))
      throw InvalidArgument(who + ": key '" + name + "' is not part of this model's training state (another model, "
                            "optimizer or loss-scaling setting?)");
  std::int64_t steps = 0;
  {
    const auto it = reader.metadata().find("weft.steps");
    if (it == reader.metadata().end())
      throw InvalidArgument(who + ": metadata key 'weft.steps' is missing (not a DataParallel checkpoint?)");
    const std::string& text = it->second;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), steps);
    if (ec != std::errc() || end != text.data() + text.size() || steps < 0)
      throw InvalidArgument(who + ": metadata key 'weft.steps' is '" + text + "', not a step count");
  }

  // The entries: replicated tensors into replica 0 (copied to the others
  // after the load), sharded ones as pieces into temporaries packed into
  // each member's chunk afterwards.
  std::vector<checkpoint::Entry> entries;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (from, to) after the load
  struct Packing {
    std::vector<Tensor> pieces;
    Tensor chunk;
  };
  std::vector<Packing> packings;
  auto whole = [&](const std::string& name, const Tensor& t) { entries.push_back({.name = name, .tensor = t}); };
  const std::size_t n = m.devices.size();

  if (m.shard() != Shard::parameters)
    for (std::size_t pos = 0; pos < m.order.size(); ++pos) {
      whole(m.param(0, pos).name, m.param(0, pos).value);
      for (std::size_t r = 1; r < n; ++r) copies.emplace_back(m.param(0, pos).value, m.param(r, pos).value);
    }
  {
    const std::vector<nn::Buffer*> first = m.replicas[0]->buffers();
    for (std::size_t i = 0; i < first.size(); ++i) {
      whole(first[i]->name, first[i]->value);
      for (std::size_t r = 1; r < n; ++r) copies.emplace_back(first[i]->value, m.replicas[r]->buffers()[i]->value);
    }
  }
  if (!m.scale.empty()) {
    whole(kLossScaleNames[0], m.scale[0]);
    whole(kLossScaleNames[1], m.growth_tracker[0]);
    whole(kLossScaleNames[2], m.skipped[0]);
    for (std::size_t r = 1; r < n; ++r) {
      copies.emplace_back(m.scale[0], m.scale[r]);
      copies.emplace_back(m.growth_tracker[0], m.growth_tracker[r]);
      copies.emplace_back(m.skipped[0], m.skipped[r]);
    }
  }
  if (m.shard() == Shard::none) {
    const std::vector<nn::Buffer*> first = m.optimizers[0]->state();
    for (std::size_t i = 0; i < first.size(); ++i) {
      whole(first[i]->name, first[i]->value);
      for (std::size_t r = 1; r < n; ++r) copies.emplace_back(first[i]->value, m.optimizers[r]->state()[i]->value);
    }
  } else {
    Tensor step;  // every slot's step count: the first parameter's
    for (std::size_t b = 0; b < m.buckets.size(); ++b)
      for (std::size_t r = 0; r < n; ++r) {
        ShardSlot& slot = *m.slots[b][r];
        if (!slot.optimizer) continue;
        const std::vector<ChunkPiece> pieces = m.chunk_pieces(b, slot.range);
        auto add_chunk = [&](const std::string& suffix, const Tensor& chunk) {
          Packing packing{{}, chunk};
          for (const ChunkPiece& piece : pieces) {
            Tensor t = Tensor::empty(*m.engine, Shape{piece.end - piece.begin}, chunk.device());  // (offload: the host)
            entries.push_back({.name = m.param(0, piece.pos).name + suffix, .tensor = t, .shape = m.shapes[piece.pos],
                               .begin = piece.begin, .end = piece.end});
            packing.pieces.push_back(t);
          }
          packings.push_back(std::move(packing));
        };
        if (m.shard() == Shard::parameters) add_chunk("", slot.param.value);
        for (std::size_t s = 0; s < states.size(); ++s) {
          if (states[s] == "step") {
            if (!step.defined()) {
              step = Tensor::empty(*m.engine, Shape{1}, m.devices[0]);
              whole(m.param(0, 0).name + ".step", step);
            }
            copies.emplace_back(step, ckpt_slot_state(slot, s).value);
            continue;
          }
          add_chunk("." + states[s], ckpt_slot_state(slot, s).value);
        }
      }
  }
  // Everything checked (and checkpoint::load checks its entries before it
  // writes any): now the writes.
  checkpoint::load(reader, entries, {.strict = false});
  for (auto& [from, to] : copies) to.copy_from(from);
  for (Packing& p : packings) ops::pack(p.pieces, p.chunk);
  m.steps = steps;
  for (auto& opt : m.optimizers) opt->set_steps(steps);
  for (auto& bucket_slots : m.slots)
    for (auto& slot : bucket_slots)
      if (slot->optimizer) slot->optimizer->set_steps(steps);
  // Offload: the host's master chunks and the GPUs' copies agree again
  // (stages 1 and 2 loaded the replicas' parameters, stage 3 the masters).
  if (m.offloaded())
    for (auto& bucket_slots : m.slots)
      for (auto& slot : bucket_slots) {
        if (slot->range.size() == 0) continue;
        if (m.shard() == Shard::parameters) slot->device_value.copy_from(slot->param.value);
        else slot->param.value.copy_from(slot->device_value);
      }
  // Stage 3 under FullParameters: the gathered parameters follow the load.
  if (m.shard() == Shard::parameters && m.full_depth > 0) m.gather_all();
}

}  // namespace weft::parallel
