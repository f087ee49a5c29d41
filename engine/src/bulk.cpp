// Bulking: what both engines share — collecting a thread's pushes, deciding
// what may join, flushing. How a flushed bulk runs is each engine's
// launch_bulk. docs/design/bulking.md.
#include <cstdio>
#include <utility>
#include <string>
#include <vector>

#include "engine_base.h"

namespace weft::detail {

namespace {
// What one thread collects for one engine (engines are told apart by id:
// unlike an address, an id is never reused by a later engine).
struct BulkBuffer {
  std::uint32_t engine_id = 0;
  std::size_t size = 0;  // > 1
  OpBlock* head = nullptr;  // collected ops in push order, linked by ready_next
  OpBlock* tail = nullptr;
  std::size_t count = 0;
};
thread_local std::vector<BulkBuffer> tls_bulks;

BulkBuffer* find_bulk(std::uint32_t engine_id) noexcept {
  for (BulkBuffer& b : tls_bulks)
    if (b.engine_id == engine_id) return &b;
  return nullptr;
}

// Ops that may run as members of one bulk: one worker of one lane, in one
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
      tls_bulks.push_back(BulkBuffer{engine_id_, ops, nullptr, nullptr, 0});
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
  tls_bulks.erase(tls_bulks.begin() + (b - tls_bulks.data()));
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
  if (tls_bulks.empty()) return;  // the common case: nobody bulks
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
  if (count == 0) return;
  if (count == 1) {
    first->ready_next = nullptr;
    launch(first);
  } else {
    launch_bulk(first, count);
  }
}

bool EngineBase::bulk_push(OpBlock* op) {
  if (tls_bulks.empty() || current_op_scope() != nullptr) return false;
  BulkBuffer* b = find_bulk(engine_id_);
  if (!b) return false;
  const bool joins = !op->async && op->after_gpu_work.empty();
  if (b->count > 0 && (!joins || !same_place(*b->head, *op))) {
    try {
      flush_bulk();
    } catch (...) {
      recycle(op);  // not pushed: the flush before it failed
      throw;
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
  auto recycle_all = [&] {
    for (OpBlock* op = first; op != nullptr;) {
      OpBlock* next = op->ready_next;
      op->ready_next = nullptr;
      recycle(op);
      op = next;
    }
  };
  // As the threaded engine's bulk, pushed as a whole or not at all: a
  // variable deleted (by another thread) since the ops were collected fails
  // them all.
  for (const OpBlock* op = first; op != nullptr; op = op->ready_next) {
    for (const VarEntry* e = op->entries; e != op->entries + op->entry_count; ++e) {
      if (e->slot->generation.load(std::memory_order_acquire) == e->generation) continue;
      std::string message =
          "push (op '" + bulk_name(first, count) + "'): var #" + std::to_string(e->var_id) + " was deleted";
      recycle_all();
      throw InvalidArgument(message);
    }
  }
  while (first != nullptr) {
    OpBlock* op = first;
    first = op->ready_next;  // the op's block is recycled once it ran
    op->ready_next = nullptr;
    launch(op);  // the naive engine's launch runs it; errors stay on its variables
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
                 "they collected since their last flush never run\n",
                 n);
}

}  // namespace weft::detail
