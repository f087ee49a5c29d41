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
  bool profile_summary = false;  // WEFT_PROFILE_SUMMARY=1: print the op table at exit
};

// Throws weft::Error naming the setting (field or environment variable).
ResolvedConfig resolve(const EngineConfig& config);

}  // namespace weft::detail
