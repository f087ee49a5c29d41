// The validation checks of weft-bench-scaling (scaling_checks.h): real
// engine work on simulated GPUs under the modeled mode, against closed forms.
// Both use the built-in h100 profile (its rates are the formulas' B, latency
// and memory bandwidth) at the caller's dilation, and restore the caller's
// options afterwards. Warm-up runs (allocations, first touches) run at
// dilation 1; the timed ones at the caller's.
#include "scaling_checks.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "weft/engine.h"
#include "weft/gpu.h"
#include "weft/gpu_sim.h"
#include "weft/nn.h"
#include "weft/parallel/collectives.h"
#include "weft/parallel/metrics.h"
#include "weft/parallel/pipeline.h"
#include "weft/profiler.h"
#include "weft/tensor.h"

namespace weft_bench {

namespace {

namespace gpu = weft::gpu;
namespace par = weft::parallel;
using weft::Device;
using weft::Engine;
using weft::Shape;
using weft::Tensor;

// The h100 profile's figures the formulas use (docs/design/simulated-gpus.md).
constexpr double kNvlinkBytesPerS = 450e9, kNvlinkLatencyS = 2e-6;
constexpr double kNicBytesPerS = 50e9, kNicLatencyS = 5e-6;
constexpr double kMemoryBytesPerS = 3000e9, kLaunchS = 4e-6;
constexpr int kGpusPerNode = 8;

// Restores the caller's model options at the end of a scope.
class RestoreModel {
 public:
  RestoreModel() : saved_(gpu::sim_model()) {}
  ~RestoreModel() {
    try {
      gpu::set_sim_model(saved_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "weft-bench-scaling: restoring the sim model: %s\n", e.what());
    }
  }
  RestoreModel(const RestoreModel&) = delete;
  RestoreModel& operator=(const RestoreModel&) = delete;

 private:
  gpu::SimModelOptions saved_;
};

// One compute stream per GPU: modeled kernels of two streams overlap fully
// (no SM contention), so two would run two micro-batches of a stage at once.
std::unique_ptr<Engine> gpu_engine(int gpus) {
  weft::EngineConfig config;
  config.cpu_devices = 1;
  config.gpu_devices = gpus;
  config.compute_streams_per_gpu = 1;
  // The host pushes a whole step ahead: under the default bound it would
  // wait for completions and enqueue late against the modeled timeline.
  config.max_inflight = std::size_t{1} << 22;
  return Engine::create(config);
}

bool enough_gpus(int gpus, const std::string& what) {
  if (gpu::device_count() >= gpus) return true;
  std::fprintf(stderr, "weft-bench-scaling: %s skipped: it needs %d simulated GPUs, WEFT_SIM_GPUS gives %d\n",
               what.c_str(), gpus, gpu::device_count());
  return false;
}

// One ring allreduce of `bytes` (float32) over gpu(0..n-1), nodes of 8.
ValidationCheck ring_check(int n, std::int64_t bytes, double dilation) {
  const int nodes = (n + kGpusPerNode - 1) / kGpusPerNode;
  ValidationCheck c;
  c.check = "ring_allreduce gpus=" + std::to_string(n) + " nodes=" + std::to_string(nodes) +
            " bytes=" + std::to_string(bytes) + " dilation=" + std::to_string(static_cast<long long>(dilation));
  c.unit = "ms";
  c.tolerance = 0.10;
  gpu::set_sim_model({.model = "h100", .gpus_per_node = kGpusPerNode, .dilation = 1});
  auto e = gpu_engine(n);
  std::vector<Device> members;
  for (int r = 0; r < n; ++r) members.push_back(Device::gpu(r));
  const par::Communicator comm = par::Communicator::local(*e, members);
  const std::int64_t count = bytes / 4;
  std::vector<Tensor> t;
  for (int r = 0; r < n; ++r) t.push_back(Tensor::empty(*e, Shape{count}, Device::gpu(r)));
  par::allreduce(comm, t, par::ReduceOp::sum, {.name = "warm-up"});  // scratch buffers and first touches
  e->wait_all();
  gpu::set_sim_model({.model = "h100", .gpus_per_node = kGpusPerNode, .dilation = dilation});
  // From the profiler's GPU stream spans (modeled time): a copy starts at
  // its modeled readiness, not when its stream's thread woke, so the host's
  // wake-up lag at either end is left out.
  weft::Profiler& profiler = e->profiler();
  profiler.clear();
  profiler.start();
  par::allreduce(comm, t, par::ReduceOp::sum, {.name = "timed"});
  e->wait_all();
  profiler.stop();
  std::int64_t first = 0, last = 0;
  bool any = false;
  for (const weft::Span& span : profiler.spans()) {
    if (span.kind != weft::TrackKind::stream || std::string_view(span.name).find("'timed'") == std::string_view::npos)
      continue;
    if (!any) first = span.start_ns, last = span.end_ns, any = true;
    first = std::min(first, span.start_ns);
    last = std::max(last, span.end_ns);
  }
  c.measured = static_cast<double>(last - first) * 1e-6;
  // 2(N-1) steps of S/N bytes over the ring's slowest link, each ending a
  // latency later. In one node every link is NVLink and each reduce-scatter
  // step's add (launch + 3 S/N bytes at memory bandwidth) lies on the ring's
  // path; over nodes the NIC is busy from the first step to the last and
  // the adds hide behind it.
  const double s = static_cast<double>(count) * 4, steps = 2.0 * (n - 1);
  const bool network = nodes > 1;
  const double b = network ? kNicBytesPerS : kNvlinkBytesPerS, latency = network ? kNicLatencyS : kNvlinkLatencyS;
  const double add = kLaunchS + 3 * s / n / kMemoryBytesPerS;
  c.expected = (steps / n * s / b + steps * latency + (network ? 0.0 : (n - 1) * add)) * 1e3;
  return c;
}

// K identical stages of two Dense(4096, 4096) layers on gpu(0..K-1) (with
// interleaving, two chunks of one layer each), M micro-batches of 512 rows:
// per layer and micro-batch one forward GEMM and two in the backward (the
// input's and the weight's gradient), long against the activation's copy
// between stages over NVLink.
// The bubble: per stage, 1 - (the union of its compute spans on its GPU's
// stream) / (the step: first to last compute span of any stage), averaged
// over the stages.
ValidationCheck bubble_check(const std::string& schedule, int k, int m, double dilation) {
  constexpr std::int64_t kWidth = 4096, kRows = 512;
  constexpr int kLayers = 2;
  const int v = schedule == "interleaved-1f1b" ? 2 : 1;
  ValidationCheck c;
  c.check = "pipeline_bubble schedule=" + schedule + " stages=" + std::to_string(k) +
            " micro_batches=" + std::to_string(m) + " dilation=" + std::to_string(static_cast<long long>(dilation));
  c.unit = "fraction";
  c.tolerance = 0.03;
  c.expected = par::predicted_bubble(schedule, k, m, v);  // F = B = W
  gpu::set_sim_model({.model = "h100", .gpus_per_node = kGpusPerNode, .dilation = 1});
  auto e = gpu_engine(k);
  weft::nn::Sequential model;
  for (int l = 0; l < k * kLayers; ++l)
    model.emplace<weft::nn::Dense>(*e, kWidth, kWidth, Device::cpu(0), static_cast<std::uint64_t>(l + 1));
  std::vector<Device> devices;
  for (int s = 0; s < k; ++s) devices.push_back(Device::gpu(s));
  par::Pipeline pipe(*e, model,
                     {.balance = std::vector<int>(static_cast<std::size_t>(k * v), kLayers / v),
                      .devices = devices,
                      .chunks = m,
                      .virtual_stages = v,
                      .schedule = schedule});
  const std::int64_t rows = kRows * m;
  const Tensor x = Tensor::zeros(*e, Shape{rows, kWidth}, Device::gpu(0));
  const Tensor labels = Tensor::zeros(*e, Shape{rows}, Device::gpu(k - 1));
  pipe.train_step(x, labels);  // warm-up: allocations
  e->wait_all();
  gpu::set_sim_model({.model = "h100", .gpus_per_node = kGpusPerNode, .dilation = dilation});
  weft::Profiler& profiler = e->profiler();
  profiler.clear();
  profiler.start();
  pipe.train_step(x, labels);
  e->wait_all();
  profiler.stop();
  // The profiler's clock is modeled time under the mode.
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> busy(static_cast<std::size_t>(k));
  std::int64_t first = 0, last = 0;
  bool any = false;
  const std::vector<weft::Span> spans = profiler.spans();
  for (int s = 0; s < k; ++s) {
    const std::string marker = par::Pipeline::span_marker(s);
    for (const weft::Span& span : spans) {
      if (span.kind != weft::TrackKind::stream || weft::is_copy(span.property)) continue;
      if (std::string_view(span.name).find(marker) == std::string_view::npos) continue;
      busy[static_cast<std::size_t>(s)].emplace_back(span.start_ns, span.end_ns);
      if (!any) first = span.start_ns, last = span.end_ns, any = true;
      first = std::min(first, span.start_ns);
      last = std::max(last, span.end_ns);
    }
  }
  double bubble = 0;
  for (auto& v : busy) {
    std::sort(v.begin(), v.end());
    std::int64_t covered = 0, end = first;
    for (const auto& [lo, hi] : v) {
      const std::int64_t from = std::max(lo, end);
      if (hi > from) covered += hi - from;
      end = std::max(end, hi);
    }
    bubble += last > first ? 1.0 - static_cast<double>(covered) / static_cast<double>(last - first) : 1.0;
  }
  c.measured = bubble / k;
  return c;
}

}  // namespace

std::vector<ValidationCheck> ring_allreduce_checks(double dilation) {
  RestoreModel restore;
  std::vector<ValidationCheck> out;
  constexpr std::int64_t kMiB = std::int64_t{1} << 20;
  // 64 MiB within a node; over nodes 16 MiB (1 MiB and 256 KiB per step at
  // 16 and 64 GPUs), which keeps the host's memory (a tensor and a scratch
  // buffer per GPU, whose bytes the copies move) at 2 GiB and its memcpys
  // short against the dilated steps.
  const std::vector<std::pair<int, std::int64_t>> configs = {
      {2, 64 * kMiB}, {4, 64 * kMiB}, {8, 64 * kMiB}, {16, 16 * kMiB}, {64, 16 * kMiB}};
  for (const auto& [n, bytes] : configs)
    if (enough_gpus(n, "ring_allreduce gpus=" + std::to_string(n))) out.push_back(ring_check(n, bytes, dilation));
  return out;
}

std::vector<ValidationCheck> pipeline_bubble_checks(double dilation) {
  RestoreModel restore;
  std::vector<ValidationCheck> out;
  for (int k : {4, 8}) {
    if (!enough_gpus(k, std::string("pipeline_bubble stages=") + std::to_string(k))) continue;
    for (int m : {2 * k, 32}) {
      ValidationCheck one_f = {};
      for (const char* schedule : {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b"}) {
        ValidationCheck c = bubble_check(schedule, k, m, dilation);
        c.check += std::string(" theory=") + (schedule[0] == 'z'   ? "(K-1)/(3M+K-1)"
                                              : schedule[0] == 'i' ? "(K-1)/(vM+K-1) v=2"
                                                                   : "(K-1)/(M+K-1)");
        if (std::string(schedule) == "1f1b") one_f = c;
        if (std::string(schedule) == "zb-h1" && m == 2 * k) {
          // ZB-H1 against 1F1B at M = 2K, the same peak activations: at most
          // the theory's ratio, (3K-1)/(7K-1), plus the tolerance.
          ValidationCheck ratio = c;
          ratio.check = "pipeline_bubble_ratio zb-h1/1f1b stages=" + std::to_string(k) + " micro_batches=" +
                        std::to_string(m) + " at_most=(3K-1)/(7K-1)";
          ratio.measured = one_f.measured > 0 ? c.measured / one_f.measured : 1.0;
          ratio.expected = (3.0 * k - 1) / (7.0 * k - 1);
          ratio.tolerance = 0.05;
          ratio.at_most = true;
          out.push_back(c);
          out.push_back(ratio);
          continue;
        }
        out.push_back(c);
      }
    }
  }
  return out;
}

}  // namespace weft_bench
