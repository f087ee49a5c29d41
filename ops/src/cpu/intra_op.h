// The one oneTBB arena every CPU kernel parallelizes in. Several engine
// workers may run kernels at the same time; sharing one arena of a fixed
// number of slots keeps the busy threads bounded by the machine's cores
// instead of workers x cores.
#pragma once

#include <tbb/task_arena.h>

namespace weft::kernels::cpu {

// Created on first use with intra_op_threads() slots. The first creation also
// pins OpenBLAS to one thread: its own pool would oversubscribe the engine's
// workers, so gemm splits big products across this arena instead.
tbb::task_arena& intra_op_arena();

// n >= 1 (a weft::Error otherwise). Recreates the arena: call it only while
// no kernel is running (at start-up, or between tests). An n above the core
// count is honoured (TBB's process-wide worker cap is raised to n while it
// stands), which oversubscribes the machine: meant for tests and experiments.
void set_intra_op_threads(int n);

// The arena's concurrency: the last set_intra_op_threads value, or
// weft::available_cpus() (the affinity mask's CPUs) until then.
int intra_op_threads();

}  // namespace weft::kernels::cpu
