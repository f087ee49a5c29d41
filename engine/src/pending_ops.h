// Engine::pending_ops' snapshot of the variables' queues (pending_ops.cpp).
#pragma once

#include <functional>
#include <vector>

#include "op_block.h"
#include "var_table.h"
#include "weft/engine.h"

namespace weft::detail {

// Locks every variable of `vars` (in address order, as push does), lists the
// ops queued on them as waiting, calls `running` (still under the locks) for
// the ops that run and hold variables — blocks that stay valid while the
// locks are held — and names, for each access not granted yet, the op
// holding its variable. Variable names are read after the locks are let go.
std::vector<PendingOp> snapshot_pending(const VarTable& vars,
                                        const std::function<void(std::vector<const OpBlock*>&)>& running);

}  // namespace weft::detail
