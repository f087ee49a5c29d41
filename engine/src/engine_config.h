// EngineConfig with every "0 / empty: from the environment" resolved.
#pragma once

#include <cstddef>
#include <string>

#include "weft/engine.h"

namespace weft::detail {

struct ResolvedConfig {
  std::string kind;
  int cpu_devices = 1;
  int workers_per_cpu_device = 1;
  std::size_t max_inflight = EngineConfig::kDefaultMaxInflight;
  std::string profile_path;
  bool profile_summary = false;  // WEFT_PROFILE_SUMMARY=1: profile from creation, print the tables at exit
  int gpu_devices = 0;             // never more than gpu::device_count()
  int compute_streams_per_gpu = 2;
  std::size_t gpu_workspace_bytes = 0;
  ConvAlgo conv_algo;
};

// Throws weft::Error naming the setting (field or environment variable).
ResolvedConfig resolve(const EngineConfig& config);

}  // namespace weft::detail
