// How the CPU kernels split their work: on the shared intra-op arena, in
// pieces big enough that scheduling costs little next to the work, and not at
// all for sizes where entering the arena would cost more than the loop.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>

#include "cpu/intra_op.h"

namespace weft::kernels::cpu::detail {

// About this many cheap operations (a load, an add, a store) per piece: a few
// microseconds, well above the cost of a TBB task.
inline constexpr std::int64_t kMinPieceWork = 1 << 15;

// Items per piece when each item costs about `cost` cheap operations.
inline std::int64_t grain_for(std::int64_t cost) { return std::max<std::int64_t>(1, kMinPieceWork / std::max<std::int64_t>(1, cost)); }

// body(begin, end) over disjoint pieces covering [0, n). Pieces must not
// depend on how the range is split for a result to be the same for every
// thread count: kernels that reduce use fixed chunks of their own.
template <class Body>
void parallel_for(std::int64_t n, std::int64_t grain, const Body& body) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  tbb::task_arena& arena = intra_op_arena();
  // With one thread per kernel, each engine worker runs its kernels itself:
  // entering a one-slot arena would make concurrent workers take turns.
  if (n <= grain || arena.max_concurrency() == 1) {
    body(std::int64_t{0}, n);
    return;
  }
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, grain),
                      [&](const tbb::blocked_range<std::int64_t>& r) { body(r.begin(), r.end()); });
  });
}

}  // namespace weft::kernels::cpu::detail
