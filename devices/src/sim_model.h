// The cost model of the sim backend's modeled mode (weft/gpu_sim.h): a
// device profile (peak rates, memory bandwidth, launch latency, links), an
// optional cost table measured on a real GPU, the links of the simulated
// nodes with their modeled clocks, and the counts. Internal to devices/.
#pragma once

#include <chrono>
#include <cstdint>
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
  double launch_us = 0;    // added to every kernel the profile times
  double pcie_gbps = 0, pcie_latency_us = 0;      // each direction, per GPU
  double nvlink_gbps = 0, nvlink_latency_us = 0;  // each direction, per GPU, within a node
  double nic_gbps = 0, nic_latency_us = 0;        // each direction, per node, between nodes
};
SimProfile h100_profile();
// A `key value` profile file; InvalidArgument naming the file and line.
SimProfile read_profile_file(const std::string& path);

// Per op name and shape key: microseconds on the stream.
struct CostTable {
  std::string file;
  std::unordered_map<std::string, double> us;  // key: op + '\t' + shape
};

// One direction of a link: copies on it follow one another on its modeled
// clock (a copy starts when the link is free and the copy is ready).
struct SimLink {
  std::mutex mutex;
  SimClock::time_point free_at{};
};

struct SimModel {
  SimModelOptions options;
  SimProfile profile;
  std::optional<CostTable> table;
  int gpus = 0;
  // Per GPU: PCIe to and from the host, NVLink out of and into it; per node: its NIC out and in.
  std::vector<SimLink> h2d, d2h, nvlink_out, nvlink_in, nic_out, nic_in;

  int node_of(int gpu) const noexcept { return options.gpus_per_node > 0 ? gpu / options.gpus_per_node : 0; }
  // Predicted seconds of a kernel (counted in the stats).
  double kernel_seconds(const KernelCost& cost);
  // A modeled duration on the host clock (dilated).
  SimClock::duration host(double seconds) const {
    return std::chrono::duration_cast<SimClock::duration>(std::chrono::duration<double>(seconds * options.dilation));
  }

  std::mutex stats_mutex;
  SimModelStats stats;
};

// Reads `options.model` (a built-in name or a file) for `gpus` simulated GPUs.
std::shared_ptr<SimModel> make_sim_model(const SimModelOptions& options, int gpus);

}  // namespace weft::gpu::detail
