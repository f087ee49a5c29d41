// Variable slots and the handles that name them.
//
// Slots live in chunks that are never freed while the engine lives, so reading
// a stale handle's generation is always safe: a Var is valid iff its engine id
// matches and its generation equals the slot's. delete_var bumps the
// generation at once (so later pushes fail) and the slot is recycled only when
// the deletion op has run behind everything pending on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "error_log.h"
#include "spin_lock.h"
#include "weft/var.h"

namespace weft::detail {

struct OpBlock;
struct GpuVarState;

// One access of one op to one variable; queued on the variable until granted.
struct VarEntry {
  VarSlot* slot = nullptr;
  VarEntry* next = nullptr;
  OpBlock* op = nullptr;
  std::uint32_t generation = 0;  // of the handle pushed; rechecked under the lock
  std::uint32_t var_id = 0;      // of the handle pushed, for messages
  bool write = false;  // exclusive access
  bool read = false;   // the op reads the value (a read, or a variable in both lists)
};

// Dependency state of one variable. Invariants (asserted in debug and sanitizer builds):
//   write_running implies running_reads == 0;
//   the head of the queue is blocked: a read only while a write runs, a write
//   while anything runs. Grants happen strictly in queue (= push) order.
struct alignas(64) VarSlot {
  SpinLock lock;
  bool write_running = false;
  std::uint32_t running_reads = 0;
  std::atomic<std::uint32_t> generation{1};
  std::uint32_t id = 0;
  VarEntry* head = nullptr;
  // A live slot's last queued access (null when its queue is empty); a free
  // slot's successor in the free list (its queue is empty then). One word for
  // both keeps a slot in one cache line.
  union {
    VarEntry* tail = nullptr;
    VarSlot* next_free;
  };
  // Both written only by the op holding the variable's write access (no
  // other op runs on it then): a plain store for the version; the error
  // under the lock, except by a replay's node or a bulk's member, whose
  // holder or bulk holds the access for them (error_of() readers queue
  // behind it).
  std::atomic<std::uint64_t> version{0};
  ErrorRef error;  // set by the last completed write
  std::atomic<GpuVarState*> gpu{nullptr};  // created by the first GPU op on it (gpu_sync.h)

  // Whether the op with this push id, reading the variable, inherits its
  // failure. Safe without the lock while the caller holds a granted access
  // (no writer can run).
  bool fails(std::uint64_t op_id) const noexcept { return error && error->reaches(op_id); }
};

static_assert(sizeof(VarSlot) == 64, "a variable's state is one cache line");

struct VarAccess {
  static Var make(VarSlot* slot, std::uint32_t id, std::uint32_t generation, std::uint32_t engine_id) noexcept {
    Var v;
    v.slot_ = slot;
    v.id_ = id;
    v.generation_ = generation;
    v.engine_id_ = engine_id;
    return v;
  }
  static VarSlot* slot(const Var& v) noexcept { return v.slot_; }
  static std::uint32_t generation(const Var& v) noexcept { return v.generation_; }
  static std::uint32_t engine_id(const Var& v) noexcept { return v.engine_id_; }
};

class VarTable {
 public:
  explicit VarTable(std::uint32_t engine_id) : engine_id_(engine_id) {}
  ~VarTable();
  VarTable(const VarTable&) = delete;
  VarTable& operator=(const VarTable&) = delete;

  Var create(std::string_view name);
  // The latest name given (empty if none). Takes the table's mutex: for
  // the profiler, not the hot path.
  std::string name_of(std::uint32_t id) const;
  // Names a live variable (empty: unnamed); throws like resolve() otherwise.
  void set_name(const Var& var, std::string_view name);
  // The live slot of `var`; throws weft::Error naming the var and `what` (the
  // call that used it) for a null, deleted or foreign handle.
  VarSlot* resolve(const Var& var, std::string_view what) const;
  // Invalidates the handle now (a second delete is an error).
  VarSlot* retire(const Var& var);
  // Returns a slot whose deletion op has run to the free list.
  void recycle(VarSlot* slot);

  std::string describe(const Var& var) const;  // "var #12 'weights'"
  // Every slot handed out so far, live or free (Engine::pending_ops walks
  // their queues); takes the table's mutex.
  std::vector<VarSlot*> all_slots() const;
  std::size_t live() const noexcept { return live_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::size_t kChunk = 1024;
  std::uint32_t engine_id_;
  mutable std::mutex mutex_;  // guards chunks_, free_, names_, next_id_
  std::vector<std::unique_ptr<VarSlot[]>> chunks_;
  std::size_t used_in_last_chunk_ = kChunk;
  VarSlot* free_ = nullptr;
  std::uint32_t next_id_ = 0;
  std::unordered_map<std::uint32_t, std::string> names_;
  std::atomic<std::size_t> live_{0};
};

}  // namespace weft::detail
