// The validation checks of weft-bench-scaling (scaling_checks.h): real
// engine work on simulated GPUs under the modeled mode, against published
// measurements (nccl-tests) and against closed forms of the model's own
// links (the ring, the pipeline bubbles; those use the built-in dgx-h100
// profile, whose rates are the formulas' B, latency and memory bandwidth).
// Each restores the caller's options afterwards.
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

// The dgx-h100 profile's figures the formulas use (docs/design/simulated-gpus.md).
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

// The first start to the last end of the GPU stream spans whose name holds `marker` (ms).
double spans_ms(const weft::Profiler& profiler, std::string_view marker) {
  std::int64_t first = 0, last = 0;
  bool any = false;
  for (const weft::Span& span : profiler.spans()) {
    if (span.kind != weft::TrackKind::stream || std::string_view(span.name).find(marker) == std::string_view::npos)
      continue;
    if (!any) first = span.start_ns, last = span.end_ns, any = true;
    first = std::min(first, span.start_ns);
    last = std::max(last, span.end_ns);
  }
  return static_cast<double>(last - first) * 1e-6;
}

// An allreduce of `bytes` (float32) over gpu(0..n-1) in nodes of n / nodes
// under the caller's model, timed from the profiler's GPU spans (ms).
double allreduce_ms(int n, int nodes, std::int64_t bytes) {
  const gpu::SimModelOptions caller = gpu::sim_model();
  gpu::set_sim_model({.model = caller.model, .gpus_per_node = n / nodes});
  auto e = gpu_engine(n);
  std::vector<Device> members;
  for (int r = 0; r < n; ++r) members.push_back(Device::gpu(r));
  const par::Communicator comm = par::Communicator::local(*e, members);
  std::vector<Tensor> t;
  for (int r = 0; r < n; ++r) t.push_back(Tensor::empty(*e, Shape{bytes / 4}, Device::gpu(r)));
  par::allreduce(comm, t, par::ReduceOp::sum, {.name = "warm-up"});
  e->wait_all();
  weft::Profiler& profiler = e->profiler();
  profiler.clear();
  profiler.start();
  par::allreduce(comm, t, par::ReduceOp::sum, {.name = "timed"});
  e->wait_all();
  profiler.stop();
  return spans_ms(profiler, "'timed'");
}

// One allreduce of `bytes` (float32) over gpu(0..n-1), nodes of 8, under
// the dgx-h100 profile, against the formula of its links.
ValidationCheck ring_check(int n, std::int64_t bytes) {
  const int nodes = (n + kGpusPerNode - 1) / kGpusPerNode;
  ValidationCheck c;
  c.check = std::string(nodes > 1 ? "hierarchical_allreduce" : "ring_allreduce") + " gpus=" + std::to_string(n) +
            " nodes=" + std::to_string(nodes) + " bytes=" + std::to_string(bytes);
  c.unit = "ms";
  c.tolerance = 0.10;
  c.source = "the model's own formula (consistency, not validation)";
  gpu::set_sim_model({.model = "dgx-h100", .gpus_per_node = kGpusPerNode});
  c.measured = allreduce_ms(n, nodes, bytes);
  const double s = static_cast<double>(bytes / 4) * 4;
  auto add = [](double b) { return kLaunchS + 3 * b / kMemoryBytesPerS; };
  if (nodes == 1) {
    // 2(N-1) steps of S/N bytes over NVLink, each ending a latency later,
    // with each reduce-scatter step's add on the ring's path.
    const double steps = 2.0 * (n - 1);
    c.expected = (steps / n * s / kNvlinkBytesPerS + steps * kNvlinkLatencyS + (n - 1) * add(s / n)) * 1e3;
  } else {
    // Reduce-scatter in the node (g - 1 NVLink steps of S/g and their
    // adds), the rail's ring allreduce of S/g over the m nodes (2(m - 1)
    // NIC steps of S/(g m), the first m - 1 with their adds), all-gather in
    // the node.
    const int g = kGpusPerNode, m = nodes;
    const double node_step = s / g / kNvlinkBytesPerS + kNvlinkLatencyS;
    const double rail_step = s / g / m / kNicBytesPerS + kNicLatencyS;
    c.expected = ((g - 1) * (node_step + add(s / g)) + (m - 1) * (rail_step + add(s / g / m)) + (m - 1) * rail_step +
                  (g - 1) * node_step) *
                 1e3;
  }
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
ValidationCheck bubble_check(const std::string& schedule, int k, int m) {
  constexpr std::int64_t kWidth = 4096, kRows = 512;
  constexpr int kLayers = 2;
  const int v = schedule == "interleaved-1f1b" ? 2 : 1;
  ValidationCheck c;
  c.check = "pipeline_bubble schedule=" + schedule + " stages=" + std::to_string(k) +
            " micro_batches=" + std::to_string(m);
  c.unit = "fraction";
  c.tolerance = 0.03;
  c.expected = par::predicted_bubble(schedule, k, m, v);  // F = B = W
  c.source = "the schedule's theory (weft/parallel/metrics.h)";
  gpu::set_sim_model({.model = "dgx-h100", .gpus_per_node = kGpusPerNode});
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

// Published all_reduce_perf figures (bus bandwidth at large messages).
const PublishedBusBandwidth kNcclTests[] = {
    // One node, NCCL's ring (NVLS off) on an HGX H100 (8 x H100 SXM, NCCL
    // 2.26.2), all_reduce_perf up to 16 GB: its peak busbw.
    {8, 1, std::int64_t{1} << 30, 368.76,
     "NVIDIA/nccl-tests issue 309 (2025-05-23): Dell XE9680 HGX 8 x H100, NVLS disabled, all_reduce_perf busbw "
     "368.76 GB/s"},
    // Four nodes of 8 H100s, eight 400G RoCE NICs each, NCCL 2.19.3,
    // all_reduce_perf -b 4G -e 8G: busbw 320 GB/s, NVLS on or off.
    {32, 4, std::int64_t{4} << 30, 320,
     "NVIDIA/nccl issue 1221 (2024-03-13): 4 nodes x 8 H100, 8 x 400G RoCE per node, NCCL 2.19.3, 4G-8G, busbw "
     "320 GB/s"},
    // 248 servers of 8 H200s, eight NICs each, at 512 MB, NCCL's default
    // algorithm: "typically around 350G"; at 8 nodes here (an assumption:
    // large-message busbw changes little with the node count).
    {64, 8, std::int64_t{512} << 20, 350,
     "NVIDIA/nccl-tests issue 283 (2025-01-18): 248 x 8 H200, 8 NICs per node, 512M, default algorithm, busbw ~350 GB/s"},
};
const std::size_t kNcclTestsCount = sizeof kNcclTests / sizeof kNcclTests[0];
// ResNet-50 throughput on 1 and 8 GPUs of one node, the same batch per
// GPU, synthetic data: Lambda's benchmarks on 8 x H100 SXM5 (NVIDIA's
// DeepLearningExamples main.py; the "FP32" runs without --amp, whose
// convolutions PyTorch runs in TF32 by default), and NVIDIA's own README
// on a DGX A100 (pytorch-21.03 container, batch 256).
const PublishedScaling kResnet50Scaling[] = {
    {"dgx-h100", 8, 1280, "bf16", 22098.35 / (8 * 2790.64),
     "lambdal/deeplearning-benchmark pytorch/results_v2, 1x/8x H100 80GB SXM5, PyTorch_resnet50_AMP batch 1280: "
     "2790.64 -> 22098.35 img/s"},
    {"dgx-h100", 8, 640, "tf32", 14973.70 / (8 * 1893.38),
     "lambdal/deeplearning-benchmark pytorch/results_v2, 1x/8x H100 80GB SXM5, PyTorch_resnet50_FP32 batch 640: "
     "1893.38 -> 14973.70 img/s"},
    {"dgx-a100", 8, 256, "tf32", 7248.0 / (8 * 938.0),
     "NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md, DGX A100, TF32: 938 -> 7248 "
     "img/s (1 -> 8 GPUs)"},
    {"dgx-a100", 8, 256, "bf16", 16621.0 / (8 * 2470.0),
     "NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md, DGX A100, mixed precision: "
     "2470 -> 16621 img/s (1 -> 8 GPUs)"},
};
const std::size_t kResnet50ScalingCount = sizeof kResnet50Scaling / sizeof kResnet50Scaling[0];

std::vector<ValidationCheck> nccl_tests_checks() {
  RestoreModel restore;
  std::vector<ValidationCheck> out;
  for (std::size_t i = 0; i < kNcclTestsCount; ++i) {
    const PublishedBusBandwidth& p = kNcclTests[i];
    const std::string what = "nccl_tests_allreduce gpus=" + std::to_string(p.gpus) + " nodes=" + std::to_string(p.nodes) +
                             " bytes=" + std::to_string(p.bytes) + " busbw";
    if (!enough_gpus(p.gpus, what)) continue;
    ValidationCheck c;
    c.check = what;
    c.unit = "GB/s";
    c.expected = p.busbw_gbps;
    c.tolerance = 0.15;
    c.source = p.source;
    const double ms = allreduce_ms(p.gpus, p.nodes, p.bytes);
    c.measured = static_cast<double>(p.bytes) / (ms * 1e-3) * 2.0 * (p.gpus - 1) / p.gpus / 1e9;
    out.push_back(c);
  }
  return out;
}

std::vector<ValidationCheck> ring_allreduce_checks() {
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
    if (enough_gpus(n, "ring_allreduce gpus=" + std::to_string(n))) out.push_back(ring_check(n, bytes));
  return out;
}

std::vector<ValidationCheck> pipeline_bubble_checks() {
  RestoreModel restore;
  std::vector<ValidationCheck> out;
  for (int k : {4, 8}) {
    if (!enough_gpus(k, std::string("pipeline_bubble stages=") + std::to_string(k))) continue;
    for (int m : {2 * k, 32}) {
      ValidationCheck one_f = {};
      for (const char* schedule : {"gpipe", "1f1b", "zb-h1", "interleaved-1f1b"}) {
        ValidationCheck c = bubble_check(schedule, k, m);
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
