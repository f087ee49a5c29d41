#include "var_table.h"

#include <cassert>

#include "gpu_sync.h"
#include "weft/error.h"

namespace weft::detail {

VarTable::~VarTable() {
  for (auto& chunk : chunks_)
    for (std::size_t i = 0; i < kChunk; ++i) destroy_gpu_state(chunk[i]);
}

std::string VarTable::name_of(std::uint32_t id) const {
  std::lock_guard lock(mutex_);
  auto it = names_.find(id);
  return it == names_.end() ? std::string() : it->second;
}

void VarTable::set_name(const Var& var, std::string_view name) {
  VarSlot* slot = resolve(var, "set_var_name");
  std::lock_guard lock(mutex_);
  // Rechecked under the lock: deletion bumps the generation before the slot
  // is recycled (which erases the name under this lock), so a name given to
  // a variable deleted meanwhile is not left behind.
  if (slot->generation.load(std::memory_order_acquire) != VarAccess::generation(var)) return;
  if (name.empty())
    names_.erase(var.id());
  else
    names_.insert_or_assign(var.id(), std::string(name));
}

Var VarTable::create(std::string_view name) {
  std::lock_guard lock(mutex_);
  VarSlot* slot;
  if (free_) {
    slot = free_;
    free_ = slot->next_free;
    slot->tail = nullptr;  // live again: the word is its queue's tail
  } else {
    if (used_in_last_chunk_ == kChunk) {
      chunks_.push_back(std::make_unique<VarSlot[]>(kChunk));
      used_in_last_chunk_ = 0;
    }
    slot = &chunks_.back()[used_in_last_chunk_++];
  }
  slot->id = ++next_id_;
  if (!name.empty()) names_.emplace(slot->id, std::string(name));
  live_.fetch_add(1, std::memory_order_relaxed);
  return VarAccess::make(slot, slot->id, slot->generation.load(std::memory_order_relaxed), engine_id_);
}

VarSlot* VarTable::resolve(const Var& var, std::string_view what) const {
  VarSlot* slot = VarAccess::slot(var);
  if (!slot) throw InvalidArgument(std::string(what) + ": null weft::Var (default-constructed, never returned by new_var)");
  if (VarAccess::engine_id(var) != engine_id_)
    throw InvalidArgument(std::string(what) + ": " + describe(var) + " belongs to another engine");
  if (slot->generation.load(std::memory_order_acquire) != VarAccess::generation(var))
    throw InvalidArgument(std::string(what) + ": " + describe(var) + " was deleted");
  return slot;
}

VarSlot* VarTable::retire(const Var& var) {
  VarSlot* slot = resolve(var, "delete_var");
  std::uint32_t expected = VarAccess::generation(var);
  if (!slot->generation.compare_exchange_strong(expected, expected + 1, std::memory_order_acq_rel))
    throw InvalidArgument("delete_var: " + describe(var) + " was deleted");
  return slot;
}

void VarTable::recycle(VarSlot* slot) {
  assert(!slot->head && !slot->write_running && slot->running_reads == 0);
  slot->version.store(0, std::memory_order_relaxed);
  slot->error.reset();
  destroy_gpu_state(*slot);
  std::lock_guard lock(mutex_);
  names_.erase(slot->id);
  slot->next_free = free_;
  free_ = slot;
  live_.fetch_sub(1, std::memory_order_relaxed);
}

std::vector<VarSlot*> VarTable::all_slots() const {
  std::lock_guard lock(mutex_);
  std::vector<VarSlot*> slots;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const std::size_t used = c + 1 == chunks_.size() ? used_in_last_chunk_ : kChunk;
    for (std::size_t i = 0; i < used; ++i) slots.push_back(&chunks_[c][i]);
  }
  return slots;
}

std::string VarTable::describe(const Var& var) const {
  std::string text = "var #" + std::to_string(var.id());
  if (VarAccess::engine_id(var) != engine_id_) return text;
  std::lock_guard lock(mutex_);
  if (auto it = names_.find(var.id()); it != names_.end()) text += " '" + it->second + "'";
  return text;
}

}  // namespace weft::detail
