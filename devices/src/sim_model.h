// The cost model of the sim backend's modeled mode (weft/gpu_sim.h): a
// device profile (peak rates, memory bandwidth, launch latency, links), an
// optional cost table measured on a real GPU, the links of the simulated
// nodes with their modeled clocks, and the counts. Internal to devices/.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "weft/gpu_sim.h"

namespace weft::gpu::detail {

using SimClock = std::chrono::steady_clock;

struct SimProfile {
  std::string name;
  double tflops[4] = {};  // by Math: fp32, tf32, bf16, fp16
  double memory_gbps = 0;  // device memory, bytes read + written per second / 1e9
  double launch_us = 0;    // per kernel: on the stream, and the host's cost of launching it
  double fill_outputs = 0; // output elements at which a compute-bound kernel runs at half its peak (0: always at peak)
  double pcie_gbps = 0, pcie_latency_us = 0;      // each direction, per GPU
  double nvlink_gbps = 0, nvlink_latency_us = 0;  // each direction, per GPU, within a node
  double nic_gbps = 0, nic_latency_us = 0;        // each direction, per NIC, between nodes
  int gpus_per_node = 0;
  int nics_per_node = 0;
  std::vector<int> nic_of_gpu;  // per GPU of a node, its NIC; empty: spread evenly
  double fabric_oversubscription = 1;  // the network's rate between nodes is nic_gbps / this
};
// The built-in profiles: "dgx-h100", "dgx-h200", "dgx-a100"; null for another name.
std::optional<SimProfile> builtin_profile(const std::string& name);
// A `key value` profile file; InvalidArgument naming the file and line.
SimProfile read_profile_file(const std::string& path);

// Per op name and shape key: microseconds on the stream.
struct CostTable {
  std::string file;
  std::unordered_map<std::string, double> us;  // key: op + '\t' + shape
};

// One direction of a link: the modeled intervals during which copies hold
// it. A copy takes the earliest interval, from its readiness on, that is
// free on every link it crosses; copies reach the links in whatever order
// the host's threads run, so a copy that arrives late still fills a gap
// before later reservations (what a discrete-event simulator taking events
// in time order would give when the links are not contended).
struct SimLink {
  std::mutex mutex;
  std::map<std::int64_t, std::int64_t> busy;  // start ns -> end ns, disjoint
  std::int64_t floor = 0;                     // the end of forgotten intervals: nothing starts before it
  // The first start >= `from` at which [start, start + length) is free.
  std::int64_t first_free(std::int64_t from, std::int64_t length) const;
  void hold(std::int64_t start, std::int64_t length);
};

struct SimModel {
  SimModelOptions options;
  SimProfile profile;
  std::optional<CostTable> table;
  int gpus = 0;
  int per_node = 1;  // GPUs per node (the options' or the profile's)
  // Per GPU: PCIe to and from the host, NVLink out of and into it; per NIC
  // (node * nics_per_node + its index): out and in.
  std::vector<SimLink> h2d, d2h, nvlink_out, nvlink_in, nic_out, nic_in;
  // Per GPU: its SMs, which the kernels of all its streams share (one kernel at a time).
  std::vector<SimLink> compute;

  int node_of(int gpu) const noexcept { return gpu / per_node; }
  int nic_of(int gpu) const noexcept;  // index into nic_out / nic_in
  // Predicted seconds of a kernel (counted in the stats).
  double kernel_seconds(const KernelCost& cost);
  static SimClock::duration duration(double seconds) {
    return std::chrono::duration_cast<SimClock::duration>(std::chrono::duration<double>(seconds));
  }

  std::mutex stats_mutex;
  SimModelStats stats;
};

// Reads `options.model` (a built-in name or a file) for `gpus` simulated GPUs.
std::shared_ptr<SimModel> make_sim_model(const SimModelOptions& options, int gpus);

}  // namespace weft::gpu::detail
