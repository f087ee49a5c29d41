#include "pending_ops.h"

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace weft::detail {

std::vector<PendingOp> snapshot_pending(const VarTable& vars,
                                        const std::function<void(std::vector<const OpBlock*>&)>& running) {
  std::vector<VarSlot*> slots = vars.all_slots();
  std::sort(slots.begin(), slots.end(), std::less<>());
  for (VarSlot* s : slots) s->lock.lock();

  // Under every lock: an op with an access still queued cannot run, so its
  // block (name, device, accesses) stays as pushed; a running op that holds
  // a variable cannot finish (finishing takes that variable's lock).
  // Each queued access, with the op queued just before it on its variable
  // (0: it is the head).
  std::unordered_map<const VarEntry*, std::uint64_t> queued;  // entry -> op ahead
  // By push order (the block too: the engine's own holders share id 0).
  std::map<std::pair<std::uint64_t, const OpBlock*>, const OpBlock*> waiting;
  for (VarSlot* s : slots) {
    std::uint64_t ahead = 0;
    for (const VarEntry* e = s->head; e != nullptr; e = e->next) {
      queued.emplace(e, ahead);
      waiting.emplace(std::make_pair(e->op->id, e->op), e->op);
      ahead = e->op->id;
    }
  }
  std::vector<const OpBlock*> runs;
  running(runs);

  struct Holder {
    const OpBlock* op;
    bool write;
    bool runs;
  };
  std::unordered_multimap<const VarSlot*, Holder> holders;
  for (const auto& [id, op] : waiting)
    for (const VarEntry* e = op->entries; e != op->entries + op->entry_count; ++e)
      if (!queued.count(e)) holders.emplace(e->slot, Holder{op, e->write, false});
  for (const OpBlock* op : runs)
    for (const VarEntry* e = op->entries; e != op->entries + op->entry_count; ++e)
      holders.emplace(e->slot, Holder{op, e->write, true});

  std::vector<PendingOp> out;
  auto describe = [](const OpBlock& op, bool runs) {
    PendingOp p;
    p.id = op.id;
    p.name = op.name.empty() ? (op.kind == OpKind::bulk ? "(bulk)" : op.kind == OpKind::graph ? "(replay)" : "")
                             : op.name;
    p.device = op.device;
    p.running = runs;
    return p;
  };
  for (const auto& [id, op] : waiting) {
    PendingOp p = describe(*op, false);
    for (const VarEntry* e = op->entries; e != op->entries + op->entry_count; ++e) {
      auto q = queued.find(e);
      if (q == queued.end()) continue;  // granted
      PendingOp::Wait w;
      w.var = e->var_id;
      w.write = e->write;
      w.behind = q->second;
      // A writer holding the variable first; else any holder.
      auto [first, last] = holders.equal_range(e->slot);
      const Holder* best = nullptr;
      for (auto it = first; it != last; ++it)
        if (it->second.op != op && (!best || (it->second.write && !best->write))) best = &it->second;
      if (best) {
        w.holder = best->op->id;
        w.holder_name = best->op->name;
        w.holder_running = best->runs;
      }
      p.waits.push_back(std::move(w));
    }
    out.push_back(std::move(p));
  }
  std::unordered_set<const OpBlock*> seen;
  for (const OpBlock* op : runs)
    if (seen.insert(op).second) out.push_back(describe(*op, true));

  for (auto it = slots.rbegin(); it != slots.rend(); ++it) (*it)->lock.unlock();
  for (PendingOp& p : out)
    for (PendingOp::Wait& w : p.waits) w.var_name = vars.name_of(w.var);
  return out;
}

}  // namespace weft::detail
