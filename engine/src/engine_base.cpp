#include "engine_base.h"

#include <algorithm>
#include <cstdio>

#include "weft/gpu_sim.h"

namespace weft::detail {

namespace {
std::uint32_t next_engine_id() {
  static std::atomic<std::uint32_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

constexpr int kCpuPrioritized = 1 << 20;

std::string op_label(const std::string& name) { return name.empty() ? std::string("(unnamed)") : name; }
}  // namespace

EngineBase::EngineBase(ResolvedConfig config)
    : config_(std::move(config)), recorder_(*profiler_), engine_id_(next_engine_id()), vars_(engine_id_) {
  for (int i = 0; i < config_.cpu_devices; ++i) cpu_allocators_.push_back(make_caching_allocator(Device::cpu(i)));
  for (int i = 0; i < config_.gpu_devices; ++i) gpu_allocators_.push_back(make_caching_allocator(Device::gpu(i)));
  pinned_allocator_ = make_caching_allocator(Device::cpu_pinned(0));
  // Memory in use per device becomes a counter track while profiling.
  auto observe = [profiler = profiler_.get(), recorder = &recorder_](Device device, std::size_t in_use,
                                                                     const MemoryByRole& by_role) {
    if (profiler->running()) recorder->memory(device, in_use, by_role);
  };
  for (auto& a : cpu_allocators_) a->set_observer(observe);
  for (auto& a : gpu_allocators_) a->set_observer(observe);
  pinned_allocator_->set_observer(observe);
  for (const Device& d : devices()) nvtx_.add(d);
  if (!config_.profile_path.empty() || config_.profile_summary) profiler_->start();
}

std::string EngineBase::device_list() const {
  std::string text = "cpu(0).." + Device::cpu(config_.cpu_devices - 1).str();
  if (config_.gpu_devices > 0)
    text += " and gpu(0).." + Device::gpu(config_.gpu_devices - 1).str();
  else
    text += " (no GPU: " + std::string(gpu::to_string(gpu::backend())) + " backend" +
            (gpu::built_with_cuda() ? "" : ", built without CUDA") + ")";
  return text;
}

Allocator& EngineBase::allocator(Device device) {
  const auto i = static_cast<std::size_t>(device.index());
  if (device.is_cpu() && i < cpu_allocators_.size()) return *cpu_allocators_[i];
  if (device.is_gpu() && i < gpu_allocators_.size()) return *gpu_allocators_[i];
  if (device.kind() == DeviceKind::cpu_pinned && i == 0) return *pinned_allocator_;
  throw InvalidArgument("allocator: unknown device " + device.str() + "; this engine has " + device_list() +
              " and cpu_pinned(0)");
}

EngineBase::~EngineBase() = default;

std::uint64_t EngineBase::version(Var var) const {
  return vars_.resolve(var, "version")->version.load(std::memory_order_acquire);
}

void EngineBase::set_var_name(Var var, std::string_view name) {
  vars_.set_name(var, name);
  // While profiling, ops recorded before the rename show the new name too.
  // (Not otherwise: the profiler would keep every name ever given.)
  if (profiler_->running())
    recorder_.record_var_name((std::uint64_t{var.id()} << 32) | VarAccess::generation(var), name);
}

std::string EngineBase::var_name(Var var) const {
  vars_.resolve(var, "var_name");
  return vars_.name_of(var.id());
}

std::vector<Device> EngineBase::devices() const {
  std::vector<Device> out;
  for (int i = 0; i < config_.cpu_devices; ++i) out.push_back(Device::cpu(i));
  for (int i = 0; i < config_.gpu_devices; ++i) out.push_back(Device::gpu(i));
  return out;
}

bool EngineBase::has_device(Device device) const noexcept {
  return (device.is_cpu() && device.index() < config_.cpu_devices) ||
         (device.is_gpu() && device.index() < config_.gpu_devices);
}

int EngineBase::workers(Device device) const {
  if (device.is_cpu() && has_device(device)) return config_.workers_per_cpu_device;
  if (device.is_gpu() && has_device(device)) return config_.compute_streams_per_gpu;
  throw InvalidArgument("weft: unknown device " + device.str() + " (this engine has " + device_list() + ")");
}

OpBlock* EngineBase::prepare(OpKind kind, Device device, VarList reads, VarList writes, OpOptions&& options) {
  if (!has_device(device)) {
    throw InvalidArgument("push (op '" + op_label(options.name) + "'): unknown device " + device.str() + "; this " +
                config_.kind + " engine runs ops on " + device_list() +
                (device.kind() == DeviceKind::cpu_pinned ? " (cpu_pinned is memory: run host ops on a cpu device)"
                                                          : ""));
  }
  // The variables' lines are most likely with the worker that ran the last
  // op on them: ask for them for writing now (submit locks them), so that
  // they travel while the block is filled in, and once, instead of being
  // read shared in resolve and taken over again in submit.
  constexpr std::size_t kPrefetched = 8;
  for (std::size_t k = 0; k < writes.size() && k < kPrefetched; ++k)
    __builtin_prefetch(VarAccess::slot(writes[k]), 1, 3);
  for (std::size_t k = 0; k < reads.size() && k + writes.size() < kPrefetched; ++k)
    __builtin_prefetch(VarAccess::slot(reads[k]), 1, 3);
  OpBlock* op = ops_.acquire();
  op->issue_s = gpu::kernels_modeled() ? gpu::modeled_issue_time() : -1;
  op->in_push_order = false;  // submit decides
  op->reserve_entries(reads.size() + writes.size());
  try {
    std::string_view what = kind == OpKind::user ? std::string_view("push") : std::string_view("wait");
    auto add = [&](const Var& var, bool write) {
      VarSlot* slot;
      if (kind == OpKind::user) {
        try {
          slot = vars_.resolve(var, what);
        } catch (const Error& e) {
          throw InvalidArgument(std::string(e.what()) + " (op '" + op_label(options.name) + "', in its " +
                      (write ? "writes" : "reads") + ")");
        }
      } else {
        slot = vars_.resolve(var, options.name);
      }
      VarEntry& e = op->entries[op->entry_count++];
      e.slot = slot;
      e.generation = VarAccess::generation(var);
      e.var_id = var.id();
      e.write = write;
      e.read = !write;
      e.next = nullptr;
      e.op = op;
    };
    if (writes.size() == 1 && reads.size() == 1 && writes[0] == reads[0]) {
      // x = f(x): one access that reads and writes, nothing for
      // sort_accesses to merge (whose loads of the two flags just stored
      // would wait for the block's line, not forward from the stores).
      add(writes[0], true);
      op->entries[0].read = true;
    } else {
      for (const Var& v : writes) add(v, true);
      for (const Var& v : reads) add(v, false);
    }
  } catch (...) {
    recycle(op);
    throw;
  }
  sort_accesses(*op);
  op->name = std::move(options.name);
  if (!options.shape.empty() && profiler_->running()) op->shape = std::move(options.shape);
  op->priority = options.priority;
  op->property = options.property;
  // On a CPU device a prioritized op goes ahead of every ordinary ready op.
  if (device.is_cpu() && options.property == OpProperty::prioritized)
    op->priority = std::max(op->priority, kCpuPrioritized);
  op->device = device;
  op->kind = kind;
  op->async = false;
  // Ids start at 1: 0 means "no op" (OpBlock::unblocked_by).
  op->id = next_op_id_.fetch_add(1, std::memory_order_relaxed) + 1;
  op->bytes = options.bytes;
  op->run_on_failed_input = options.run_on_failed_input;
  op->run_inline = options.run_inline;
  op->defer_gpu_waits = options.defer_gpu_waits;
  op->after_gpu_work = std::move(options.after_gpu_work);
  op->unblocked_by.store(0, std::memory_order_relaxed);
  op->push_ns = -1;
  if (profiler_->running()) [[unlikely]] {
    try {
      record_push(*op);
    } catch (...) {  // nothing links to the op yet; its id stays unused, which no id check minds
      recycle(op);
      throw;
    }
  }
  op->pending.store(static_cast<std::int32_t>(op->entry_count) + 1, std::memory_order_relaxed);
  return op;
}

void EngineBase::sort_accesses(OpBlock& op) noexcept {
  if (op.entry_count < 2) return;
  VarEntry* first = op.entries;
  VarEntry* last = first + op.entry_count;
  if (op.entry_count == 2) {  // the common read-one-write-one op: no sort machinery
    if (first[0].slot == first[1].slot) {
      first[0].write |= first[1].write;
      first[0].read |= first[1].read;
      if (first[0].generation != first[1].generation) first[0].generation = 0;  // as below
      op.entry_count = 1;
    } else if (std::less<>()(first[1].slot, first[0].slot)) {
      std::swap(first[0], first[1]);
    }
    return;
  }
  std::sort(first, last, [](const VarEntry& a, const VarEntry& b) {
    return a.slot != b.slot ? std::less<>()(a.slot, b.slot) : a.write > b.write;
  });
  VarEntry* out = first;
  for (VarEntry* in = first + 1; in != last; ++in) {
    if (in->slot == out->slot) {
      out->write |= in->write;
      out->read |= in->read;
      // Two handles of one slot in a bulk: the variable was deleted (by
      // another thread) and the slot reused between two of its pushes.
      // Generation 0 is never valid, so submit reports the deletion.
      if (in->generation != out->generation) out->generation = 0;
    } else {
      *++out = *in;
    }
  }
  op.entry_count = static_cast<std::uint32_t>(out - first + 1);
}

void EngineBase::record_push(OpBlock& op) {
  op.push_ns = Profiler::now_ns();
  if (op.kind != OpKind::user) return;  // barriers and deletions are not ops of the graph
  PushRecord push{op.id, recorder_.intern(op.name), op.device, {}, {}};
  if (!op.shape.empty()) push.shape = recorder_.intern(op.shape);
  push.vars.reserve(op.entry_count);
  for (const VarEntry* e = op.begin_entries(); e != op.end_entries(); ++e) {
    const std::uint64_t key = (std::uint64_t{e->var_id} << 32) | e->generation;
    push.vars.push_back(VarUse{key, recorder_.intern(vars_.name_of(e->var_id)), e->write});
  }
  recorder_.record_push(std::move(push));
}

void EngineBase::push_op(OpFunction fn, Device device, VarList reads, VarList writes, OpOptions options) {
  NvtxRange range(nvtx_.push(), options.name.c_str(), options.property);
  if (!fn) throw InvalidArgument("push (op '" + options.name + "'): the op function is empty");
  if (options.run_inline)
    throw InvalidArgument("push (op '" + options.name +
                          "'): OpOptions::run_inline is for push_async ops (a body that hands its work to another "
                          "thread and returns at once)");
  if (options.defer_gpu_waits)
    throw InvalidArgument("push (op '" + options.name +
                          "'): OpOptions::defer_gpu_waits is for push_async ops (a body that orders its GPU work "
                          "after the events it is handed)");
  if (!options.after_gpu_work.empty() && !device.is_gpu())
    throw InvalidArgument("push (op '" + options.name + "') on " + device.str() +
                          ": OpOptions::after_gpu_work is for GPU ops (a CPU op waits for GPU work through its "
                          "variables)");
  OpBlock* op = prepare(OpKind::user, device, reads, writes, std::move(options));
  op->fn = std::move(fn);
  if (capture_push(op) || bulk_push(op)) return;
  launch(op);
}

void EngineBase::push_async_op(AsyncOpFunction fn, Device device, VarList reads, VarList writes, OpOptions options) {
  NvtxRange range(nvtx_.push(), options.name.c_str(), options.property);
  if (!fn) throw InvalidArgument("push_async (op '" + options.name + "'): the op function is empty");
  if (device.is_gpu())
    throw InvalidArgument("push_async (op '" + options.name + "') on " + device.str() +
                ": GPU ops complete by an event on their stream; push them with push()");
  if (!options.after_gpu_work.empty())
    throw InvalidArgument("push_async (op '" + options.name +
                          "'): OpOptions::after_gpu_work is for GPU ops (pushed with push())");
  OpBlock* op = prepare(OpKind::user, device, reads, writes, std::move(options));
  op->async_fn = std::move(fn);
  op->async = true;
  if (capture_push(op) || bulk_push(op)) return;
  launch(op);
}

std::string_view to_string_impl(OpProperty p) noexcept {
  switch (p) {
    case OpProperty::normal: return "normal";
    case OpProperty::copy_to_device: return "copy_to_device";
    case OpProperty::copy_from_device: return "copy_from_device";
    case OpProperty::copy_peer: return "copy_peer";
    case OpProperty::prioritized: return "prioritized";
  }
  return "?";
}

void EngineBase::recycle(OpBlock* op) noexcept {
  for (OpBlock* member = op->bulk; member != nullptr;) {  // a bulk's ops go with it
    OpBlock* next = member->ready_next;
    member->clear();
    ops_.release(member);
    member = next;
  }
  op->clear();
  ops_.release(op);
}

void EngineBase::refuse_wait_inside_op(std::string_view call, const Var* var) const {
  refuse_wait_while_capturing(call, var);
  if (const OpScope* scope = running_op_of(scope_key())) {
    throw OpError(std::string(call) + (var ? "(" + vars_.describe(*var) + ")" : std::string("()")) +
                      " called from inside op '" + op_label(*scope->op_name) + "' running on " +
                      scope->device.str() +
                      ": an op must not wait on the engine (it would deadlock); push a follow-up op that reads "
                      "the variable instead",
                  *scope->op_name, scope->device);
  }
}

ErrorRef EngineBase::inherited_error(OpBlock& op) const noexcept {
  if (!errors_.may_reach(op.id)) return nullptr;
  for (VarEntry* e = op.begin_entries(); e != op.end_entries(); ++e)
    if (e->read && e->slot->fails(op.id)) return e->slot->error;
  return nullptr;
}

void EngineBase::fail(OpBlock& op, std::exception_ptr error) {
  // An op that ran on a failed input and ends with that failure passes the
  // original record on (reported once), as a skipped op would.
  if (op.inherited && op.inherited->error == error) {
    op.error = op.inherited;
    return;
  }
  op.error = errors_.add(std::move(error), op.name);
}

void EngineBase::apply_write(VarSlot& slot, const OpBlock& op) noexcept {
  if (op.kind != OpKind::user) return;  // barriers and deletions order, they do not write
  // The writer holds the variable's write access: nobody else writes the
  // version now (no read-modify-write needed), readers only load it.
  slot.version.store(slot.version.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  if (slot.error != op.error) slot.error = op.error;
}

void EngineBase::report(const ErrorRef& error) {
  if (error && error->claim(id_bound())) std::rethrow_exception(error->error);
}

ErrorRef EngineBase::error_of(VarSlot& slot) {
  std::lock_guard lock(slot.lock);
  return slot.error;
}

void EngineBase::report_all_errors() { errors_.report_all(id_bound()); }

void EngineBase::at_shutdown() noexcept {
  try {
    profiler_->stop();
    if (!config_.profile_path.empty()) profiler_->dump(config_.profile_path);
    if (config_.profile_summary)
      std::fprintf(stderr, "weft profile (%s engine):\n%s%s", config_.kind.c_str(), profiler_->summary_table().c_str(),
                   profiler_->summarize().table().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft: could not write the profile: %s\n", e.what());
  }
  if (std::size_t n = errors_.pending()) {
    std::fprintf(stderr, "weft: engine destroyed with %zu op error(s) nobody waited for; first: %s\n", n,
                 errors_.first_pending_message().c_str());
  }
}

}  // namespace weft::detail

namespace weft {
std::string_view to_string(OpProperty property) noexcept { return detail::to_string_impl(property); }
}  // namespace weft
