// The modeled mode of simulated GPUs (weft/gpu_sim.h) for the training
// tools: the flags --sim-model [PROFILE|COST_TABLE] (WEFT_SIM_MODEL's
// values; bare: dgx-h100) and --sim-gpus-per-node G (WEFT_SIM_GPUS_PER_NODE
// when not given), the engine put on simulated GPUs, and the prediction of
// measured steps: the median step on the modeled timeline (gpu::modeled_now
// across each step and its wait_all), each GPU stream's utilization and the
// compute/copy overlap from the engine's profiler (ProfileSummary), and the
// cost model's report. Kernels compute nothing under the mode: a tool reads
// no values back.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arg_cursor.h"
#include "weft/device.h"
#include "weft/engine.h"
#include "weft/env.h"
#include "weft/error.h"
#include "weft/gpu.h"
#include "weft/gpu_sim.h"
#include "weft/profiler.h"

namespace weft::examples {

// The two flags as given.
struct SimFlags {
  bool on = false;
  std::string model = "dgx-h100";
  std::optional<int> gpus_per_node;

  // Takes `args`' current flag when it is one of the two (true), reading
  // its value; a bad value is a UsageError naming the flag.
  bool parse(ArgCursor& args) {
    const std::string& flag = args.flag();
    if (flag == "--sim-model") {
      on = true;
      if (std::optional<std::string> v = args.optional_value()) {
        if (v->empty()) throw UsageError{"--sim-model wants dgx-h100, dgx-h200, dgx-a100, a profile file or a cost-table file"};
        model = *v;
      }
      return true;
    }
    if (flag == "--sim-gpus-per-node") {
      const std::optional<std::string> v = args.value();
      const std::optional<long long> g = v ? ArgCursor::parse_int(*v, 1, 4096) : std::nullopt;
      if (!g) throw UsageError{"--sim-gpus-per-node wants a whole number from 1 to 4096, got '" + v.value_or("") + "'"};
      gpus_per_node = static_cast<int>(*g);
      return true;
    }
    return false;
  }

  // The tool's closing check: --sim-gpus-per-node needs --sim-model.
  void check() const {
    if (!on && gpus_per_node) throw UsageError{"--sim-gpus-per-node needs --sim-model"};
  }
};

// The --help lines of the two flags, descriptions from `column` on (each
// program aligns its own usage).
inline std::string sim_flags_help(std::size_t column) {
  struct Entry {
    const char* flag;
    std::vector<const char*> lines;
  };
  const Entry entries[] = {
      {"--sim-model [M]",
       {"predict instead of train: simulated GPUs whose kernels take modeled time",
        "and compute nothing (weft/gpu_sim.h). M: dgx-h100 (the default), dgx-h200, dgx-a100,",
        "a profile file or a cost-table file, as WEFT_SIM_MODEL takes them. Prints the",
        "predicted step time (median, warm-up excluded), each GPU stream's",
        "utilization, the compute/copy overlap, the host share and what the cost",
        "model covered; no values are read back (loss and accuracy: n/a)"}},
      {"--sim-gpus-per-node G",
       {"simulated GPUs per node: NVLink within, the NICs between nodes",
        "(default $WEFT_SIM_GPUS_PER_NODE, else the profile's: 8 for dgx-h100)"}},
  };
  std::string out;
  for (const Entry& e : entries) {
    std::string head = std::string("  ") + e.flag;
    if (head.size() + 1 > column) {
      out += head + "\n";
      head.clear();
    }
    for (const char* line : e.lines) {
      head.resize(column, ' ');
      out += head + line + "\n";
      head.clear();
    }
  }
  return out;
}

// Puts `config` on simulated GPUs for `devices` (GPUs only). A process the
// user put on another backend (WEFT_GPU_BACKEND=cuda or none), or CPU
// devices in the list, are a weft::InvalidArgument naming --sim-model.
inline void sim_prepare(const std::vector<Device>& devices, EngineConfig& config, const char* devices_flag) {
  for (Device d : devices)
    if (d.is_cpu())
      throw InvalidArgument("--sim-model models GPU kernels, but " + std::string(devices_flag) + " names " + d.str() +
                            " (give simulated GPUs only, e.g. " + devices_flag + " gpu:0,gpu:1)");
  const std::string_view chosen = env::choice_or("WEFT_GPU_BACKEND", "", {"cuda", "sim", "none"});
  if (!chosen.empty() && chosen != "sim")
    throw InvalidArgument("--sim-model runs on simulated GPUs, but WEFT_GPU_BACKEND=" + std::string(chosen) +
                          " chose another backend (unset it or set WEFT_GPU_BACKEND=sim)");
  config.gpu_backend = "sim";
  // One compute stream per GPU, as a framework's step runs: a GPU's kernels
  // then follow one another in the order the engine issues them, whichever
  // worker is free first (with two, that choice would move the prediction).
  config.compute_streams_per_gpu = 1;
  int needed = 0;
  for (Device d : devices) needed = std::max(needed, d.index() + 1);
  config.sim_gpus = std::max(needed, static_cast<int>(env::number_or("WEFT_SIM_GPUS", 0, 1, 64)));
}

// Installs the model for the GPU work enqueued from now on: the flags, the
// environment where a flag is absent. A malformed file: InvalidArgument
// naming it and the line.
inline gpu::SimModelOptions sim_install(const SimFlags& flags) {
  gpu::SimModelOptions options = gpu::sim_model_from_env();
  options.model = flags.model;
  if (flags.gpus_per_node) options.gpus_per_node = *flags.gpus_per_node;
  gpu::set_sim_model(options);
  return options;
}

// What the measured steps predict.
struct SimPrediction {
  gpu::SimModelOptions options;
  int gpus = 0;                  // simulated GPUs of the process
  std::vector<double> step_ms;   // each measured step, predicted (modeled time)
  double predicted_step_ms = 0;  // their median
  std::vector<std::pair<std::string, double>> utilization;  // GPU stream that ran work -> busy / window
  double comm_overlap = 0;  // compute vs copy spans: both / min (ProfileSummary::compute_copy)
  gpu::SimModelStats stats;
  std::string report;  // gpu::sim_model_report()

  int gpus_per_node = 0;         // the model's (gpu::sim_topology)

  int nodes() const { return gpus_per_node > 0 ? (gpus + gpus_per_node - 1) / gpus_per_node : 1; }

  // Lines for a terminal, each starting with `indent`.
  std::string text(const char* indent = "") const {
    std::string out;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%spredicted step time: %.3f ms (median of %zu measured steps, modeled time)\n",
                  indent, predicted_step_ms, step_ms.size());
    out += buf;
    out += std::string(indent) + "utilization:";
    for (std::size_t i = 0; i < utilization.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s %s %.2f", i ? "," : "", utilization[i].first.c_str(), utilization[i].second);
      out += buf;
    }
    out += utilization.empty() ? " (no GPU stream spans)\n" : "\n";
    std::snprintf(buf, sizeof buf, "%scomm overlap (compute vs copies): %.2f\n", indent, comm_overlap);
    out += buf;
    out += std::string(indent) + "cost model: " + report + "\n";
    return out;
  }

  // JSON members (no braces), each preceded by a comma.
  std::string json() const {
    std::string out = ",\"sim_model\":\"" + escaped(options.model) + "\"";
    char buf[256];
    std::snprintf(buf, sizeof buf, ",\"sim_gpus\":%d,\"nodes\":%d,\"predicted_step_ms\":%.6f", gpus, nodes(),
                  predicted_step_ms);
    out += buf;
    out += ",\"utilization\":{";
    for (std::size_t i = 0; i < utilization.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s\"%s\":%.4f", i ? "," : "", escaped(utilization[i].first).c_str(),
                    utilization[i].second);
      out += buf;
    }
    std::snprintf(buf, sizeof buf,
                  "},\"comm_overlap\":%.4f,\"kernels_modeled\":%llu,\"table_hits\":%llu,"
                  "\"fallbacks\":%llu",
                  comm_overlap, static_cast<unsigned long long>(stats.kernels),
                  static_cast<unsigned long long>(stats.from_table), static_cast<unsigned long long>(stats.fallbacks));
    out += buf;
    return out;
  }

  static std::string escaped(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
    return out;
  }
};

// Times steps one by one under the mode: begin() before the first measured
// step, step(f) per step (f pushes the step; it is flushed with wait_all),
// end() for the prediction. The profiler records the measured steps only.
class SimMeasure {
 public:
  explicit SimMeasure(Engine& engine) : engine_(engine) {}

  void begin() {
    engine_.wait_all();
    engine_.profiler().clear();
    engine_.profiler().start();
  }
  template <class F>
  void step(F&& push_step) {
    const double t0 = gpu::modeled_now();
    push_step();
    engine_.wait_all();
    step_s_.push_back(gpu::modeled_now() - t0);
  }
  SimPrediction end() {
    engine_.profiler().stop();
    SimPrediction p;
    p.options = gpu::sim_model();
    p.gpus = gpu::device_count();
    p.gpus_per_node = gpu::sim_topology().gpus_per_node;
    for (double s : step_s_) p.step_ms.push_back(1e3 * s);
    std::vector<double> sorted = p.step_ms;
    std::sort(sorted.begin(), sorted.end());
    const std::size_t n = sorted.size();
    if (n) p.predicted_step_ms = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    const ProfileSummary summary = engine_.profiler().summarize();
    for (const ResourceUsage& r : summary.resources)
      if (r.kind == TrackKind::stream && r.ops > 0) p.utilization.emplace_back(r.resource, std::clamp(r.utilization, 0.0, 1.0));
    p.comm_overlap = std::clamp(summary.compute_copy.efficiency, 0.0, 1.0);
    p.stats = gpu::sim_model_stats();
    p.report = gpu::sim_model_report();
    return p;
  }

 private:
  Engine& engine_;
  std::vector<double> step_s_;
};

}  // namespace weft::examples
