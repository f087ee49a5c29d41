#!/usr/bin/env bash
# Installs what is missing, then builds and runs the whole test suite:
#   1. AddressSanitizer + UBSan build, all tests but the heaviest end-to-end runs (ResNet-18
#      training, the pipeline sweeps, LeNet trained plain against hybridized and bulked, two of
#      LeNet's four resumes; tests/CMakeLists.txt), the GPU reruns under other simulator settings and the scripts'
#      tests, which build nothing (Release runs those);
#   2. ThreadSanitizer build against a TSan-built oneTBB: engine, devices, ops, GPU and parallel
#      tests (the GPU tests on simulated GPUs; the multi-process ones under mpirun), but a few
#      numerical and data checks and the reruns under other simulator settings (below);
#   3. Release build: every test but the suites steps 1 and 2 both ran (below); its ctest
#      summary closes the output.
# Every test runs in at least one build; `--fast` runs the whole suite in Release.
# Usage: scripts/test.sh [--fast]   (--fast: the Release build and all its tests only)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
bash scripts/setup-debian.sh

if [[ "${1:-}" != "--fast" ]]; then
  echo "== ASan + UBSan =="
  cmake --preset asan > /dev/null
  cmake --build --preset asan -j "$jobs"
  # The scripts.* tests drive Python and shell scripts on fixtures (no built code): Release runs them,
  # and the modeled-time rules of simulated GPUs, whose host must keep pace with the model.
  ctest --preset asan -j "$jobs" -E '^(scripts\.|gpu\.(stress\.jitter_seed_|collectives\.sim4|sim_model\.ring16|gpu sim model - (a GEMM takes|a cost table overrides|the profiler.s GPU spans|modeled kernels of two streams|copies share a link|a copy of undefined bytes takes|a ring allreduce)))'

  echo "== TSan =="
  bash scripts/build-tsan-tbb.sh
  cmake --preset tsan > /dev/null
  cmake --build --preset tsan -j "$jobs" --target weft-tests-engine weft-tests-devices weft-tests-ops weft-tests-gpu \
    weft-tests-parallel weft-tests-parallel-mpi weft-test-rank-dies weft-test-zero-capped weft-test-heartbeat \
    weft-test-flight-scenario
  # Numerical and data checks with little concurrency of their own stay out of this run (ops.resnet's
  # layer catalogue and split backward, GPU ops and ResNet steps against the CPU, GPU copies that
  # round-trip data, the simulator's copy timing, reading Fashion-MNIST, a pipeline's batch-norm
  # statistics, a checkpoint read back by a Python script, the optimizers against float64 formulas
  # on CPU and GPU devices, precisions' bitwise repeatability and LeNet's gradients per precision on
  # a GPU): they run under ASan (and most in Release), and cost TSan about three minutes of test
  # time. So do the reruns of GPU cases under other simulator settings (the stresses under jitter
  # seeds 2 and 3, the collectives on four simulated GPUs): the same cases run here under the
  # default settings, and the reruns cost TSan about another minute. The simulator's modeled-time
  # rules (durations of kernels, copies and the ring on its modeled clock) are timing checks that a
  # host slowed down many times over can push past their bounds: ASan and Release run them; TSan
  # runs the modeled mode's other cases.
  ctest --preset tsan -j "$jobs" -R '^(engine|devices|ops|gpu|parallel|parallel_mpi)\.' \
    -E '^(ops\.resnet (resnet18 has|backward_input then)|gpu\.gpu resnet|ops\.memory format: a ResNet-18|gpu\.gpu memory format - a ResNet-18|gpu\.gpu ops - (elementwise|reductions)|gpu\.gpu copies - (cpu cpu gpu pinned|peer copies)|gpu\.gpu backend - simulated copies take|ops\.MNIST real Fashion-MNIST|ops\.optim - every (algorithm matches a float64|step.s update is the float64)|ops\.precision - deterministic runs|gpu\.gpu optim - each algorithm.s step|gpu\.gpu precision - (LeNet.s gradients|deterministic convolution)|ops\.checkpoint_python|parallel\.pipeline with batch norm|gpu\.stress\.jitter_seed_|gpu\.collectives\.sim4|gpu\.sim_model\.ring16|gpu\.gpu sim model - (a GEMM takes|a cost table overrides|the profiler.s GPU spans|modeled kernels of two streams|copies share a link|a copy of undefined bytes takes|a ring allreduce))'
fi

echo "== Release =="
cmake --preset release > /dev/null
cmake --build --preset release -j "$jobs"
if [[ "${1:-}" == "--fast" ]]; then
  ctest --preset release -j "$jobs"
else
  # What steps 1 and 2 both ran is not run a third time: devices, the in-process parallel suites,
  # the GPU suites of engines, lifecycle, streams, errors, collectives, stream graphs, kvstore, data
  # parallel, pipelines and tensor ops on simulated GPUs, and the 2-rank MPI jobs (about 2.5 minutes
  # of test time here). Release runs the rest: the engine's scenarios at full speed, the ops and GPU ops
  # against references in optimized code, copies, the simulator's runtime, the GPU reruns, the
  # examples and end-to-end runs, the benches, the installed package, the 1- and 3-rank MPI jobs.
  ctest --preset release -j "$jobs" \
    -E '^((devices|parallel)\.|parallel_mpi\.(np2|gpu_np2|np2_no_lane|rank_dies|rank_stalled_on_lane)$|gpu\.gpu (engines|errors|lifecycle|streams|kvstore|data parallel|pipeline|collectives|stream graphs|tensor op) )'
fi
