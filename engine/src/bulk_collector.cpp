// Bulking: what both engines share — collecting a thread's pushes, deciding
// what may join, flushing. How a flushed bulk runs is each engine's
// launch_bulk. docs/design/bulking.md.
#include <cstdio>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine_base.h"
#include "engine_life.h"

namespace weft::detail {

namespace {
// What one thread collects for one engine (engines are told apart by id:
// unlike an address, an id is never reused by a later engine). `life`
// reaches the engine when the thread ends with ops still collected.
struct BulkBuffer {
  std::uint32_t engine_id = 0;
  std::size_t size = 0;  // > 1
  OpBlock* head = nullptr;  // collected ops in push order, linked by ready_next
  OpBlock* tail = nullptr;
  std::size_t count = 0;
  std::shared_ptr<EngineLife> life;
};

// A thread that ends while it bulks pushes what it collected, to every
// engine still alive (its last pushes must not vanish), and stops counting
// as bulking.
struct ThreadBulks {
  std::vector<BulkBuffer> list;
  ~ThreadBulks() {
    while (!list.empty()) {
      BulkBuffer b = std::move(list.back());
      list.pop_back();
      std::shared_lock lock(b.life->mutex);
      if (b.life->engine == nullptr) continue;  // ended: its pool took the blocks
      static_cast<EngineBase*>(b.life->engine)->thread_ended_bulking(b.head, b.count);
    }
  }
};
thread_local ThreadBulks tls_bulks;

BulkBuffer* find_bulk(std::uint32_t engine_id) noexcept {
  for (BulkBuffer& b : tls_bulks.list)
    if (b.engine_id == engine_id) return &b;
  return nullptr;
}

// Ops that may run as members of one bulk: one worker of one pool, in one
// place of the ready order.
bool same_place(const OpBlock& a, const OpBlock& b) noexcept {
  return a.device == b.device && a.property == b.property && a.priority == b.priority;
}
}  // namespace

std::size_t EngineBase::bulk_size() const noexcept {
  const BulkBuffer* b = find_bulk(engine_id_);
  return b ? b->size : 0;
}

std::size_t EngineBase::set_bulk_size(std::size_t ops) {
  BulkBuffer* b = find_bulk(engine_id_);
  const std::size_t previous = b ? b->size : 0;
  if (ops > 1) {
    if (!b) {
      tls_bulks.list.push_back(BulkBuffer{engine_id_, ops, nullptr, nullptr, 0, life()});
      bulking_threads_.fetch_add(1, std::memory_order_relaxed);
      return previous;
    }
    b->size = ops;
    flush_bulk();  // what was collected under the old size
    return previous;
  }
  if (!b) return previous;
  // The size changes first; then what was collected is pushed (which may
  // throw, and may run op bodies on this thread).
  OpBlock* first = b->head;
  const std::size_t count = b->count;
  tls_bulks.list.erase(tls_bulks.list.begin() + (b - tls_bulks.list.data()));
  bulking_threads_.fetch_sub(1, std::memory_order_relaxed);
  launch_collected(first, count);
  return previous;
}

void EngineBase::restore_bulk_size(std::size_t ops) noexcept {
  try {
    set_bulk_size(ops);  // the size is set even when the flush fails
  } catch (...) {
    errors_.add(std::current_exception(), "(BulkScope's flush at its end)");  // for wait_all
  }
}

void EngineBase::flush_bulk() {
  if (tls_bulks.list.empty()) return;  // the common case: nobody bulks
  BulkBuffer* b = find_bulk(engine_id_);
  if (!b || b->count == 0) return;
  // Taken out first: launching may run op bodies on this thread (the naive
  // engine), which may change this thread's bulks.
  OpBlock* first = std::exchange(b->head, nullptr);
  const std::size_t count = std::exchange(b->count, 0);
  b->tail = nullptr;
  launch_collected(first, count);
}

void EngineBase::launch_collected(OpBlock* first, std::size_t count) {
  if (count > 0) launch_bulk(first, count);
}

void EngineBase::thread_ended_bulking(OpBlock* first, std::size_t count) noexcept {
  bulking_threads_.fetch_sub(1, std::memory_order_relaxed);
  try {
    launch_collected(first, count);
  } catch (...) {
    errors_.add(std::current_exception(), "(the bulk of a thread that ended)");  // for wait_all
  }
}

std::exception_ptr EngineBase::flush_bulk_for_deletion() noexcept {
  try {
    flush_bulk();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

bool EngineBase::bulk_push(OpBlock* op) {
  if (tls_bulks.list.empty() || current_op_scope() != nullptr) return false;
  BulkBuffer* b = find_bulk(engine_id_);
  if (!b) return false;
  const bool joins = !op->async && op->after_gpu_work.empty();
  if (b->count > 0 && (!joins || !same_place(*b->head, *op))) {
    try {
      flush_bulk();
    } catch (...) {
      // What was collected is refused (the error says why); this op is
      // valid, and is pushed all the same, as it would have been unbulked.
      const std::exception_ptr refused = std::current_exception();
      launch(op);
      std::rethrow_exception(refused);
    }
    b = find_bulk(engine_id_);
    if (!b) return false;
  }
  if (!joins) return false;
  op->ready_next = nullptr;
  if (b->tail) {
    b->tail->ready_next = op;
  } else {
    b->head = op;
  }
  b->tail = op;
  if (++b->count >= b->size) flush_bulk();
  return true;
}

std::string EngineBase::bulk_name(const OpBlock* first, std::size_t count) {
  const OpBlock* last = first;
  while (last->ready_next) last = last->ready_next;
  std::string name = "bulk of " + std::to_string(count) + " ops";
  if (!first->name.empty() || !last->name.empty()) name += " ('" + first->name + "' .. '" + last->name + "')";
  return name;
}

void EngineBase::launch_bulk(OpBlock* first, std::size_t count) {
  auto refuse = [&](OpBlock* from, const std::string& what, std::uint32_t var_id) {
    for (OpBlock* op = from; op != nullptr;) {
      OpBlock* next = op->ready_next;
      op->ready_next = nullptr;
      recycle(op);
      op = next;
    }
    throw InvalidArgument("push (op '" + what + "'): var #" + std::to_string(var_id) + " was deleted");
  };
  auto deleted = [](const OpBlock& op) -> const VarEntry* {
    for (const VarEntry* e = op.entries; e != op.entries + op.entry_count; ++e)
      if (e->slot->generation.load(std::memory_order_acquire) != e->generation) return e;
    return nullptr;
  };
  // As the threaded engine's bulk: pushed as a whole or refused as a whole
  // when a variable was deleted (by another thread) since the ops were
  // collected ...
  for (const OpBlock* op = first; op != nullptr; op = op->ready_next)
    if (const VarEntry* e = deleted(*op)) refuse(first, count == 1 ? first->name : bulk_name(first, count), e->var_id);
  // ... then run one by one, each checked again before it is pushed: a
  // member may delete a variable of a later one (which the threaded
  // engine's bulk would hold until its end; pushing the later op would
  // have failed here).
  while (first != nullptr) {
    OpBlock* op = first;
    first = op->ready_next;  // the op's block is recycled once it ran
    op->ready_next = nullptr;
    if (const VarEntry* e = deleted(*op)) {
      const std::string name = op->name;
      const std::uint32_t id = e->var_id;
      op->ready_next = first;
      refuse(op, name, id);
    }
    launch(op);
  }
}

void EngineBase::end_bulks() noexcept {
  if (find_bulk(engine_id_) != nullptr) {
    try {
      set_bulk_size(0);
    } catch (...) {
      std::fprintf(stderr, "weft: the ops this thread collected in a bulk could not be pushed: %s\n",
                   describe_exception(std::current_exception()).c_str());
    }
  }
  if (const int n = bulking_threads_.load(std::memory_order_relaxed); n > 0)
    std::fprintf(stderr,
                 "weft: engine destroyed while %d other thread(s) still bulk their pushes (set_bulk_size): the ops "
                 "they collected since their last flush are dropped without running\n",
                 n);
}

}  // namespace weft::detail
