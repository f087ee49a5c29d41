#include "engine_config.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "weft/device.h"
#include "weft/error.h"
#include "weft/gpu.h"

namespace weft::detail {

namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

long long env_number(const char* name, long long min, long long max) {
  std::string_view text = env(name);
  long long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max)
    throw InvalidArgument(std::string("weft: environment variable ") + name + "='" + std::string(text) +
                "' is not a number in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  return value;
}

int setting(int field, const char* field_name, const char* env_name, int fallback, int max) {
  if (field < 0 || field > max)
    throw InvalidArgument(std::string("weft::EngineConfig::") + field_name + " = " + std::to_string(field) +
                " is out of range [0, " + std::to_string(max) + "] (0 means: from " + env_name + ")");
  if (field > 0) return field;
  if (env(env_name)) return static_cast<int>(env_number(env_name, 1, max));
  return fallback;
}

}  // namespace

ResolvedConfig resolve(const EngineConfig& config) {
  ResolvedConfig out;
  out.kind = config.kind;
  if (out.kind.empty()) out.kind = env("WEFT_ENGINE") ? env("WEFT_ENGINE") : "threaded";
  if (out.kind != "threaded" && out.kind != "naive")
    throw InvalidArgument("weft: engine kind '" + out.kind + "' (from " +
                (config.kind.empty() ? "WEFT_ENGINE" : "EngineConfig::kind") +
                ") is not one of: threaded, naive");

  const int cpus = available_cpus();  // the affinity mask's CPUs (taskset, cpusets, mpirun binding)
  out.cpu_devices = setting(config.cpu_devices, "cpu_devices", "WEFT_CPU_DEVICES", 1, 1024);
  out.workers_per_cpu_device = setting(config.workers_per_cpu_device, "workers_per_cpu_device",
                                       "WEFT_CPU_WORKERS", cpus, 4096);
  if (config.max_inflight > 0)
    out.max_inflight = config.max_inflight;
  else if (env("WEFT_MAX_INFLIGHT"))
    out.max_inflight = static_cast<std::size_t>(env_number("WEFT_MAX_INFLIGHT", 1, 1LL << 40));
  out.profile_path = config.profile_path;
  if (out.profile_path.empty() && env("WEFT_PROFILE")) out.profile_path = env("WEFT_PROFILE");
  if (const char* summary = env("WEFT_PROFILE_SUMMARY")) out.profile_summary = std::string_view(summary) != "0";

  if (config.sim_gpus < 0 || config.sim_gpus > 64)
    throw InvalidArgument("weft::EngineConfig::sim_gpus = " + std::to_string(config.sim_gpus) +
                          " is out of range [0, 64] (0 means: from WEFT_SIM_GPUS, else 2)");
  if (!config.gpu_backend.empty()) {
    gpu::select_backend(gpu::parse_backend(config.gpu_backend), config.sim_gpus);
  } else if (config.sim_gpus > 0) {
    throw InvalidArgument("weft::EngineConfig::sim_gpus = " + std::to_string(config.sim_gpus) +
                          " without gpu_backend = \"sim\"");
  } else if (const char* chosen = env("WEFT_GPU_BACKEND")) {
    gpu::parse_backend(chosen);  // a bad value is an error here, not zero GPUs
  }
  const int available = gpu::device_count();
  if (config.gpu_devices < -1)
    throw InvalidArgument("weft::EngineConfig::gpu_devices = " + std::to_string(config.gpu_devices) +
                " is out of range (-1: from WEFT_GPU_DEVICES or every GPU)");
  int wanted = config.gpu_devices;
  if (wanted < 0) wanted = env("WEFT_GPU_DEVICES") ? static_cast<int>(env_number("WEFT_GPU_DEVICES", 0, 1024)) : available;
  if (wanted > available)
    throw InvalidArgument("weft: " + std::to_string(wanted) + " GPU(s) asked for (EngineConfig::gpu_devices or " +
                "WEFT_GPU_DEVICES) but " + std::to_string(available) + " answer" +
                " (" + std::string(gpu::to_string(gpu::backend())) + " backend" +
                (gpu::built_with_cuda() ? "" : "; this build has no CUDA, WEFT_GPU_BACKEND=sim simulates GPUs") + ")");
  out.gpu_devices = wanted;
  out.compute_streams_per_gpu =
      setting(config.compute_streams_per_gpu, "compute_streams_per_gpu", "WEFT_GPU_STREAMS", 2, 64);
  out.gpu_workspace_bytes = config.gpu_workspace_bytes;
  return out;
}

}  // namespace weft::detail
