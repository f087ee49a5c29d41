#!/usr/bin/env bash
# Installs what is missing, then builds and runs the whole test suite:
#   1. AddressSanitizer + UBSan build, all tests but the heaviest end-to-end runs (ResNet-18
#      training, the pipeline sweeps, LeNet trained plain against hybridized and bulked;
#      tests/CMakeLists.txt);
#   2. ThreadSanitizer build against a TSan-built oneTBB: engine, devices, ops, GPU and parallel
#      tests (the GPU tests on simulated GPUs, as in every build; the multi-process ones under
#      mpirun), but a few numerical checks and reruns under other simulator settings (below);
#   3. Release build, all tests (its ctest summary closes the output).
# Usage: scripts/test.sh [--fast]   (--fast: the Release suite only)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
bash scripts/setup-debian.sh

if [[ "${1:-}" != "--fast" ]]; then
  echo "== ASan + UBSan =="
  cmake --preset asan > /dev/null
  cmake --build --preset asan -j "$jobs"
  ctest --preset asan -j "$jobs"

  echo "== TSan =="
  bash scripts/build-tsan-tbb.sh
  cmake --preset tsan > /dev/null
  cmake --build --preset tsan -j "$jobs" --target weft-tests-engine weft-tests-devices weft-tests-ops weft-tests-gpu \
    weft-tests-parallel weft-tests-parallel-mpi weft-test-rank-dies
  # Numerical checks with little concurrency of their own stay out of this run (ops.resnet's layer
  # catalogue and split backward, GPU ops and ResNet steps against the CPU): they run under ASan and
  # in Release, and cost TSan about a minute. So do the reruns of GPU cases under other simulator
  # settings (the stresses under jitter seeds 2 and 3, the collectives on four simulated GPUs): the
  # same cases run here under the default settings, and the reruns cost TSan about another minute.
  ctest --preset tsan -j "$jobs" -R '^(engine|devices|ops|gpu|parallel|parallel_mpi)\.' \
    -E '^(ops\.resnet (resnet18 has|backward_input then)|gpu\.gpu resnet|gpu\.gpu ops - elementwise|gpu\.stress\.jitter_seed_|gpu\.collectives\.sim4)'
fi

echo "== Release =="
cmake --preset release > /dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"
