#include "engine_config.h"

#include <string>
#include <string_view>

#include "weft/device.h"
#include "weft/env.h"
#include "weft/error.h"
#include "weft/gpu.h"
#include "weft/gpu_sim.h"

namespace weft::detail {

namespace {

int setting(int field, const char* field_name, const char* env_name, int fallback, int max) {
  if (field < 0 || field > max)
    throw InvalidArgument(std::string("weft::EngineConfig::") + field_name + " = " + std::to_string(field) +
                " is out of range [0, " + std::to_string(max) + "] (0 means: from " + env_name + ")");
  if (field > 0) return field;
  return static_cast<int>(env::number_or(env_name, fallback, 1, max));
}

}  // namespace

ResolvedConfig resolve(const EngineConfig& config) {
  ResolvedConfig out;
  out.kind = config.kind;
  if (out.kind.empty()) out.kind = env::choice_or("WEFT_ENGINE", "threaded", {"threaded", "naive"});
  if (out.kind != "threaded" && out.kind != "naive")
    throw InvalidArgument("weft: engine kind '" + out.kind +
                          "' (from EngineConfig::kind) is not one of: threaded, naive");

  const int cpus = available_cpus();  // the affinity mask's CPUs (taskset, cpusets, mpirun binding)
  out.cpu_devices = setting(config.cpu_devices, "cpu_devices", "WEFT_CPU_DEVICES", 1, 1024);
  out.workers_per_cpu_device = setting(config.workers_per_cpu_device, "workers_per_cpu_device",
                                       "WEFT_CPU_WORKERS", cpus, 4096);
  out.max_inflight = config.max_inflight > 0
                         ? config.max_inflight
                         : static_cast<std::size_t>(env::number_or(
                               "WEFT_MAX_INFLIGHT", static_cast<long long>(out.max_inflight), 1, 1LL << 40));
  out.profile_path = config.profile_path;
  if (out.profile_path.empty()) out.profile_path = env::text_or("WEFT_PROFILE", "");
  if (const char* summary = env::get("WEFT_PROFILE_SUMMARY")) out.profile_summary = std::string_view(summary) != "0";

  if (config.sim_gpus < 0 || config.sim_gpus > 64)
    throw InvalidArgument("weft::EngineConfig::sim_gpus = " + std::to_string(config.sim_gpus) +
                          " is out of range [0, 64] (0 means: from WEFT_SIM_GPUS, else 2)");
  if (!config.gpu_backend.empty()) {
    gpu::select_backend(gpu::parse_backend(config.gpu_backend), config.sim_gpus);
  } else if (config.sim_gpus > 0) {
    throw InvalidArgument("weft::EngineConfig::sim_gpus = " + std::to_string(config.sim_gpus) +
                          " without gpu_backend = \"sim\"");
  } else {
    // A bad value is an error here, not zero GPUs (device_count() cannot throw).
    static_cast<void>(env::choice_or("WEFT_GPU_BACKEND", "", {"cuda", "sim", "none"}));
  }
  if (!config.sim_model.empty()) {
    if (gpu::backend() != gpu::Backend::sim)
      throw InvalidArgument("weft::EngineConfig::sim_model = '" + config.sim_model +
                            "' without the sim backend (gpu_backend = \"sim\" or WEFT_GPU_BACKEND=sim)");
    gpu::SimModelOptions wanted = gpu::sim_model_from_env();
    wanted.model = config.sim_model;
    const gpu::SimModelOptions now = gpu::sim_model();
    if (now.model != wanted.model || now.gpus_per_node != wanted.gpus_per_node)
      gpu::set_sim_model(wanted);
  }
  const int available = gpu::device_count();
  if (config.gpu_devices < -1)
    throw InvalidArgument("weft::EngineConfig::gpu_devices = " + std::to_string(config.gpu_devices) +
                " is out of range (-1: from WEFT_GPU_DEVICES or every GPU)");
  int wanted = config.gpu_devices;
  if (wanted < 0) wanted = static_cast<int>(env::number_or("WEFT_GPU_DEVICES", available, 0, 1024));
  if (wanted > available)
    throw InvalidArgument("weft: " + std::to_string(wanted) + " GPU(s) asked for (EngineConfig::gpu_devices or " +
                "WEFT_GPU_DEVICES) but " + std::to_string(available) + " answer" +
                " (" + std::string(gpu::to_string(gpu::backend())) + " backend" +
                (gpu::built_with_cuda() ? "" : "; this build has no CUDA, WEFT_GPU_BACKEND=sim simulates GPUs") + ")");
  out.gpu_devices = wanted;
  out.compute_streams_per_gpu =
      setting(config.compute_streams_per_gpu, "compute_streams_per_gpu", "WEFT_GPU_STREAMS", 2, 64);
  out.gpu_workspace_bytes = config.gpu_workspace_bytes;
  out.conv_algo =
      config.conv_algo.empty()
          ? ConvAlgo::parse(env::choice_or("WEFT_CONV_ALGO", "heuristic",
                                           {"heuristic", "benchmark", "deterministic", "benchmark+deterministic"}))
          : ConvAlgo::parse(config.conv_algo, "weft::EngineConfig::conv_algo");
  return out;
}

}  // namespace weft::detail

namespace weft {

std::string ConvAlgo::str() const {
  if (benchmark) return deterministic ? "benchmark+deterministic" : "benchmark";
  return deterministic ? "deterministic" : "heuristic";
}

ConvAlgo ConvAlgo::parse(std::string_view text, std::string_view what) {
  if (text == "heuristic") return {false, false};
  if (text == "benchmark") return {true, false};
  if (text == "deterministic" || text == "heuristic+deterministic") return {false, true};
  if (text == "benchmark+deterministic" || text == "deterministic+benchmark") return {true, true};
  throw InvalidArgument(std::string(what) + " = '" + std::string(text) +
                        "' is not one of: heuristic, benchmark, deterministic, benchmark+deterministic");
}

}  // namespace weft
