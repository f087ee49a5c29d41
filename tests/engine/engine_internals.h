// White-box views of the threaded engine's state, for the few tests that must
// order one thread's push after another thread's push has been linked (a
// barrier counts in inflight() before it is queued on its variable, so the
// count alone cannot say that).
#pragma once

#include <cstddef>
#include <mutex>

#include "var_table.h"  // engine/src: internal
#include "weft/var.h"

namespace weft_test {

// Accesses queued on `var` behind what runs (not yet granted), in the
// threaded engine; read under the variable's lock.
inline std::size_t queued_accesses(const weft::Var& var) {
  weft::detail::VarSlot* slot = weft::detail::VarAccess::slot(var);
  std::lock_guard lock(slot->lock);
  std::size_t n = 0;
  for (const weft::detail::VarEntry* e = slot->head; e != nullptr; e = e->next) ++n;
  return n;
}

}  // namespace weft_test
