// The six overlap demos (Dive into Deep Learning, "Computational
// Performance", run on Weft). Each prints its table and returns its figures
// (the --json line); weft-demo-<name> runs one with flags, weft-demo runs
// them all small as a tour.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "demo_support.h"

namespace weft::demo {

// 1. Asynchronous vs synchronous dispatch.
struct AsyncOptions {
  std::int64_t ops = 1000;       // y = x + 1, with a wait after each vs one wait
  std::int64_t elements = 1000;  // size of x
  std::int64_t products = 10;    // random n x n, then a matmul, returning before wait_all
  std::int64_t n = 1000;
  std::string device = "cpu:0";
};
void add_flags(DemoCli& cli, AsyncOptions& o);
nlohmann::json run_async(const AsyncOptions& o, const CommonOptions& c);

// 2. Barriers: wait_all vs wait_to_read on an intermediate; implicit blockers.
struct BarrierOptions {
  std::int64_t n = 1000;     // matrix size
  std::int64_t chain = 6;    // matmuls queued after the intermediate result
  std::string device = "cpu:0";
};
void add_flags(DemoCli& cli, BarrierOptions& o);
nlohmann::json run_barriers(const BarrierOptions& o, const CommonOptions& c);

// 3. Memory footprint of waiting per minibatch or not, and the in-flight bound.
struct MemoryOptions {
  std::int64_t batches = 150;
  std::int64_t batch_size = 1024;
  std::int64_t width = 2048;  // MLP 512 -> width -> 512 -> 1
  std::int64_t inputs = 512;
  std::string device = "cpu:0";
};
void add_flags(DemoCli& cli, MemoryOptions& o);
nlohmann::json run_memory(const MemoryOptions& o, const CommonOptions& c);

// 4. CPU and GPU working at once (two CPU devices where no GPU answers).
struct CpuGpuOptions {
  std::int64_t count = 10;
  std::int64_t cpu_n = 2000;
  std::int64_t gpu_n = 6000;  // without GPU the second CPU device uses cpu_n
  std::int64_t reps = 3;
};
void add_flags(DemoCli& cli, CpuGpuOptions& o);
nlohmann::json run_cpu_gpu(const CpuGpuOptions& o, const CommonOptions& c);

// 5. Compute overlapped with copies to the host.
struct ComputeCopyOptions {
  std::int64_t count = 24;  // the last result's copies hide under nothing: efficiency <= 1 - 1/count
  std::int64_t n = 4000;      // GPU; the CPU form uses cpu_n
  std::int64_t cpu_n = 1000;
  std::int64_t reps = 3;
};
void add_flags(DemoCli& cli, ComputeCopyOptions& o);
nlohmann::json run_compute_copy(const ComputeCopyOptions& o, const CommonOptions& c);

// 6. A 2-layer MLP on a CPU and two devices, its dependency graph and timeline.
struct MultiDeviceOptions {
  std::int64_t steps = 10;
  std::int64_t batch_size = 1024;
  std::int64_t inputs = 256;
  std::int64_t hidden = 1024;
  std::string dot_path = "weft-multidevice.dot";
};
void add_flags(DemoCli& cli, MultiDeviceOptions& o);
nlohmann::json run_multidevice(const MultiDeviceOptions& o, const CommonOptions& c);

}  // namespace weft::demo
