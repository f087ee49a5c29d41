// The simulator's modeled mode (weft/gpu_sim.h), on simulated GPUs only: a
// modeled GEMM takes its modeled time, with and without dilation, and a
// bf16 one the bf16 rate's; modeled kernels of two streams overlap while
// the host's cores are busy (they hold none); a cost table's entry overrides
// the profile and a missing op falls back and is counted; reading a tensor a
// modeled kernel wrote is an error naming the mode, while real copies keep
// real values; copies of uncomputed values (and the ring's under the mode)
// move no bytes but take their modeled time; copies on one link follow
// one another, the other direction runs beside them, a copy across the
// node boundary takes the network's time and latency; a ring allreduce of S bytes over N GPUs (2, 4, 8 in a
// node, 16 over two nodes) takes 2(N-1)/N * S / B plus its latencies within
// 10%; the profiler's GPU spans are in modeled time; malformed profiles and
// tables name the file and the line.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gpu_test_util.h"
#include "weft/allocator.h"
#include "weft/gpu_sim.h"
#include "weft/gpu_timing.h"
#include "weft/profiler.h"
#include "weft/tensor_op.h"
#include "weft/parallel/collectives.h"

using namespace gputest;
namespace ops = weft::ops;
namespace gpu = weft::gpu;
namespace par = weft::parallel;

#define WEFT_REQUIRE_SIM()                                                        \
  do {                                                                            \
    WEFT_REQUIRE_GPU();                                                           \
    if (!simulated()) {                                                           \
      std::printf("[weft-skip] the modeled mode is the simulator's own\n");       \
      std::fflush(stdout);                                                        \
      return;                                                                     \
    }                                                                             \
  } while (0)

namespace {

using Clock = std::chrono::steady_clock;

double host_seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sets the modeled mode for a scope, and turns it off after.
struct ModelScope {
  explicit ModelScope(gpu::SimModelOptions o) { gpu::set_sim_model(o); }
  ~ModelScope() { gpu::set_sim_model({}); }
  ModelScope(const ModelScope&) = delete;
  ModelScope& operator=(const ModelScope&) = delete;
};

// A file under the temporary directory, removed at the end of the scope.
struct TempFile {
  explicit TempFile(const std::string& name, const std::string& text)
      : path((std::filesystem::temp_directory_path() /
              ("weft-sim-" + std::to_string(::getpid()) + "-" + name)).string()) {
    std::ofstream(path) << text;
  }
  ~TempFile() { std::filesystem::remove(path); }
  std::string path;
};

// Records `event` on the stream of the GPU op that reads `t` (an engine
// with one compute stream per GPU runs every compute op on that stream).
void record_after(const Tensor& t, gpu::TimingEvent& event) {
  weft::push_tensor_op(t.device(), {t}, {}, [&event](weft::RunContext& ctx, const weft::TensorData&) {
    event.record(ctx.gpu->stream);
  }, {.name = "timing event"});
}

// Keeps gpu(0)'s one compute stream busy for about half a second of host
// time: 12288^3 float32 GEMMs (73 ms each at the h100 profile's 51 TFLOP/s,
// times the dilation). Work enqueued meanwhile starts on the modeled clock
// when its predecessor ends, whatever the host's lag between its pushes (a
// sanitizer's host pushes an op in milliseconds), so a measurement that
// follows the gate times the model alone. Its ops' names end in " [gate]".
constexpr std::int64_t kGateN = 12288;
void busy_gate(Engine& e) {
  ops::PushScope scope(0, "gate");
  const int count = std::max(1, static_cast<int>(std::ceil(0.5 / (gpu::sim_dilation() * 0.0728))));
  Tensor g = Tensor::zeros(e, Shape{kGateN, kGateN}, Device::gpu(0));
  for (int i = 0; i < count; ++i) g = ops::matmul(g, g);
}

struct Timed {
  double host = 0;     // host seconds from the first push to the last result
  double modeled = 0;  // seconds between events on the stream's modeled clock (dilated)
};

// `count` chained n x n GEMMs on gpu(0) of `e` (one compute stream).
Timed chained_gemms(Engine& e, std::int64_t n, int count, weft::DType dtype) {
  Tensor a = Tensor::zeros(e, Shape{n, n}, Device::gpu(0), dtype);
  const Tensor b = Tensor::zeros(e, Shape{n, n}, Device::gpu(0), dtype);
  e.wait_all();
  busy_gate(e);
  gpu::TimingEvent start(0), end(0);
  const auto t0 = Clock::now();
  record_after(a, start);
  for (int i = 0; i < count; ++i) a = ops::matmul(a, b);
  record_after(a, end);
  a.wait_to_read();
  Timed t;
  t.host = host_seconds_since(t0);
  e.wait_all();
  end.synchronize();
  t.modeled = end.ms_since(start) * 1e-3;
  return t;
}

double gemm_seconds(std::int64_t n, double tflops) {
  return 4e-6 + 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / (tflops * 1e12);
}

// Expects `measured` within `rel` of `expected` (host scheduling can only add).
void expect_near(double measured, double expected, double rel, const std::string& what) {
  INFO(what << ": measured " << measured * 1e3 << " ms, modeled " << expected * 1e3 << " ms");
  CHECK(measured >= expected * (1 - rel));
  CHECK(measured <= expected * (1 + rel));
}

}  // namespace

TEST_CASE("gpu sim model - a GEMM takes its modeled time, with and without dilation" * doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  const std::int64_t n = 4096;
  {
    ModelScope model({.model = "h100"});
    auto e = make_engine({.gpu_devices = 1, .compute_streams_per_gpu = 1});
    // 10 x 2.7 ms at 51 TFLOP/s (fp32). The stream's modeled clock is exact;
    // the host's clock adds its pushes and wake-ups (on a loaded 2-core
    // machine, up to tens of ms: only a bound below is checked there).
    const double expected = 10 * gemm_seconds(n, 51);
    const Timed t = chained_gemms(*e, n, 10, weft::DType::float32);
    expect_near(t.modeled, expected, 0.05, "fp32, dilation 1, modeled clock");
    CHECK(t.host >= 0.95 * expected);
    // bf16 at 790 TFLOP/s: 20 x 0.18 ms.
    expect_near(chained_gemms(*e, n, 20, weft::DType::bfloat16).modeled, 20 * gemm_seconds(n, 790), 0.05,
                "bf16, dilation 1, modeled clock");
    CHECK(gpu::sim_model_stats().kernels >= 30);
  }
  {
    ModelScope model({.model = "h100", .dilation = 4});
    CHECK(gpu::sim_dilation() == 4);
    auto e = make_engine({.gpu_devices = 1, .compute_streams_per_gpu = 1});
    const double expected = 10 * gemm_seconds(n, 51);
    const Timed t = chained_gemms(*e, n, 10, weft::DType::float32);
    expect_near(t.modeled, 4 * expected, 0.05, "fp32, dilation 4, modeled clock (dilated)");
    expect_near(gpu::predicted_seconds(t.modeled), expected, 0.05, "fp32, dilation 4, predicted");
    CHECK(gpu::predicted_seconds(t.host) >= 0.95 * expected);
  }
  CHECK(!gpu::kernels_modeled());
  CHECK(gpu::sim_dilation() == 1);
}

// The engine's profiler under the mode: GPU stream spans are in modeled
// time (not dilated), and so is the summary's busy time of the stream.
TEST_CASE("gpu sim model - the profiler's GPU spans take the modeled time under dilation" * doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  const std::int64_t n = 4096;
  const double dilation = 20;
  ModelScope model({.model = "h100", .dilation = dilation});
  auto e = make_engine({.gpu_devices = 1, .compute_streams_per_gpu = 1});
  Tensor a = Tensor::zeros(*e, Shape{n, n}, Device::gpu(0));
  const Tensor b = Tensor::zeros(*e, Shape{n, n}, Device::gpu(0));
  e->wait_all();
  busy_gate(*e);
  weft::Profiler& profiler = e->profiler();
  profiler.start();
  const int count = 5;
  for (int i = 0; i < count; ++i) a = ops::matmul(a, b);
  e->wait_all();
  profiler.stop();
  const double expected = gemm_seconds(n, 51);  // 2.7 ms at 51 TFLOP/s (fp32)
  int spans = 0;
  double gate_ms = 0;  // the gate's GEMMs that ran after the profiler started
  for (const weft::Span& span : profiler.spans()) {
    if (span.kind != weft::TrackKind::stream || std::string(span.name).find("matmul") == std::string::npos) continue;
    if (std::string(span.name).find("[gate]") != std::string::npos) {
      gate_ms += static_cast<double>(span.end_ns - span.start_ns) * 1e-6;
      continue;
    }
    ++spans;
    expect_near(static_cast<double>(span.end_ns - span.start_ns) * 1e-9, expected, 0.05, "a GEMM's stream span");
  }
  CHECK(spans == count);
  double busy_ms = 0;
  for (const weft::ResourceUsage& r : profiler.summarize().resources)
    if (r.kind == weft::TrackKind::stream && r.device == Device::gpu(0)) busy_ms += r.busy_ms;
  expect_near((busy_ms - gate_ms) * 1e-3, count * expected, 0.05, "the GPU streams' busy time in the summary");
}

TEST_CASE("gpu sim model - modeled kernels of two streams overlap on a busy host (they hold no core)" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  const double dilation = 4;  // wake-ups on a loaded host weigh a quarter as much
  ModelScope model({.model = "h100", .dilation = dilation});
  // Two threads keep every core of a small machine busy meanwhile.
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  for (int i = 0; i < 2; ++i)
    spinners.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  const gpu::StreamResources s1(0, gpu::StreamRole::compute, 0), s2(0, gpu::StreamRole::compute, 0);
  // 10 kernels of 5 ms (2.55e11 FLOP at 51 TFLOP/s, plus the launch) on each stream.
  const gpu::KernelCost cost{"test gemm", "-", 5e-3 * 51e12, 0, gpu::Math::fp32};
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i) {
    gpu::launch_modeled_kernel(s1.handles().stream, cost);
    gpu::launch_modeled_kernel(s2.handles().stream, cost);
  }
  s1.synchronize();
  s2.synchronize();
  const double wall = host_seconds_since(t0);
  stop = true;
  for (std::thread& t : spinners) t.join();
  // Side by side: the modeled 50 ms (on the host clock, dilated); one after
  // the other, as kernels holding the cores in turn would run, twice that.
  const double one_stream = dilation * 10 * (5e-3 + 4e-6);
  INFO("two streams of 10 x 5 ms: " << wall * 1e3 << " ms on the host clock, one stream's modeled time "
                                     << one_stream * 1e3 << " ms");
  CHECK(wall >= 0.95 * one_stream);
  CHECK(wall <= 0.75 * 2 * one_stream);
}

TEST_CASE("gpu sim model - a cost table overrides the profile, and a missing op falls back and is counted" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  const std::string key = "float32[256,256];float32[256,256]->float32[256,256]";
  const TempFile table("table.txt", "weft-cost-table 1\nprofile h100  # fallback\n"
                                    "# op shape microseconds\n"
                                    "matmul " + key + " 3000\n"
                                    "matmul float32[12288,12288];float32[12288,12288]->float32[12288,12288] 100000\n"
                                    "cast to bfloat16 float32[4]->bfloat16[4] 1\n");
  ModelScope model({.model = table.path});
  CHECK(gpu::modeled_kernel_seconds({"matmul", key, 1, 0, gpu::Math::fp32}) == doctest::Approx(3e-3));
  auto e = make_engine({.gpu_devices = 1, .compute_streams_per_gpu = 1});
  expect_near(chained_gemms(*e, 256, 5, weft::DType::float32).modeled, 5 * 3e-3, 0.05,
              "5 GEMMs the table times at 3 ms");
  const gpu::SimModelStats before = gpu::sim_model_stats();
  CHECK(before.fallbacks == 3);  // the three zeros() (two and the gate's): "full" is not in the table
  const Tensor a = Tensor::zeros(*e, Shape{128, 128}, Device::gpu(0));
  const Tensor c = ops::matmul(a, a);
  c.wait_to_read();
  const gpu::SimModelStats after = gpu::sim_model_stats();
  CHECK(after.from_table == before.from_table);
  CHECK(after.fallbacks == before.fallbacks + 2);
  CHECK(after.missing.at("matmul float32[128,128];float32[128,128]->float32[128,128]") == 1);
  CHECK(gpu::sim_model_report().find("fell back to the profile h100") != std::string::npos);
}

TEST_CASE("gpu sim model - reading a tensor a modeled kernel wrote is an error naming the mode" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  ModelScope model({.model = "h100"});
  const int gpus = std::min(gpu::device_count(), 2);
  auto e = make_engine({.cpu_devices = 1, .gpu_devices = gpus});
  const std::vector<float> host = {1, 2, 3, 4};
  const Tensor x = Tensor::from_host(*e, Shape{2, 2}, host, Device::gpu(0));  // a real copy: real values
  Tensor y = ops::matmul(x, x);
  y.set_name("product");
  // `names`: the tensor read, or the op that should have computed it.
  auto expect_no_values = [](const std::function<void()>& read, const std::string& names, const std::string& what) {
    INFO(what);
    try {
      read();
      FAIL("no error");
    } catch (const weft::Error& err) {
      const std::string m = err.what();
      INFO(m);
      CHECK(m.find(names) != std::string::npos);
      CHECK(m.find("WEFT_SIM_MODEL=h100") != std::string::npos);
      CHECK(m.find("holds no values") != std::string::npos);
    }
  };
  expect_no_values([&] { (void)y.to_host(); }, "'product' [2, 2]", "to_host");
  expect_no_values([&] { (void)ops::sum(y).item(); }, "'sum' on gpu(0)", "item of a modeled sum");
  expect_no_values([&] { (void)y.copy_to(Device::cpu(0)).to_host(); }, "'matmul' on gpu(0)", "copy to a CPU device");
  CHECK(x.to_host() == host);  // copies compute
  if (gpus == 2) {
    CHECK(x.copy_to(Device::gpu(1)).to_host() == host);
    expect_no_values([&] { (void)y.copy_to(Device::gpu(1)).to_host(); }, "'matmul' on gpu(0)",
                     "a peer copy keeps the mark");
  }
  e->wait_all();
}

namespace {

// What the sim backend's modeled copies moved and skipped since `before`.
struct CopiedBytes {
  std::uint64_t moved = 0, skipped = 0;
};
CopiedBytes copied_since(const gpu::SimModelStats& before) {
  const gpu::SimModelStats now = gpu::sim_model_stats();
  return {now.bytes_moved - before.bytes_moved, now.bytes_skipped - before.bytes_skipped};
}

}  // namespace

TEST_CASE("gpu sim model - copies of uncomputed values move no bytes; copies of host data stay exact" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  ModelScope model({.model = "h100"});
  const int gpus = std::min(gpu::device_count(), 2);
  auto e = make_engine({.cpu_devices = 1, .gpu_devices = gpus});
  std::vector<float> host(64 * 64);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.25f;
  const std::uint64_t bytes = host.size() * sizeof(float);
  const Tensor x = Tensor::from_host(*e, Shape{64, 64}, host, Device::gpu(0));  // real values
  const Tensor y = ops::matmul(x, x);                                            // none
  e->wait_all();
  std::vector<Device> targets = {Device::gpu(0)};  // a device copy, then a peer copy
  if (gpus == 2) targets.push_back(Device::gpu(1));
  for (const Device to : targets) {
    INFO("copy gpu(0) -> " << to.str());
    gpu::SimModelStats before = gpu::sim_model_stats();
    const Tensor uncomputed = y.copy_to(to);
    e->wait_all();
    CopiedBytes c = copied_since(before);
    CHECK(c.skipped == bytes);
    CHECK(c.moved == 0);
    before = gpu::sim_model_stats();
    const Tensor real = x.copy_to(to);
    e->wait_all();
    c = copied_since(before);
    CHECK(c.moved == bytes);
    CHECK(c.skipped == 0);
    CHECK(real.to_host() == host);
    CHECK_THROWS_AS((void)uncomputed.to_host(), weft::Error);
  }
  if (gpus == 2) {  // an in-process ring's tensors hold no values under the mode
    const par::Communicator comm = par::Communicator::local(*e, {Device::gpu(0), Device::gpu(1)});
    std::vector<Tensor> t = {Tensor::zeros(*e, Shape{1024}, Device::gpu(0)),
                             Tensor::zeros(*e, Shape{1024}, Device::gpu(1))};
    e->wait_all();
    const gpu::SimModelStats before = gpu::sim_model_stats();
    par::allreduce(comm, t, par::ReduceOp::sum);
    e->wait_all();
    const CopiedBytes c = copied_since(before);
    CHECK(c.skipped >= 2 * 1024 * sizeof(float));  // reduce-scatter and all-gather: S each over 2 GPUs
    CHECK(c.moved == 0);
  }
}

namespace {

// A profile with slow links, so that copies of a few MiB take milliseconds.
const char* kSlowLinks =
    "base h100\n"
    "nvlink_gbps 10\n"
    "nvlink_latency_us 2\n"
    "nic_gbps 5\n"
    "nic_latency_us 1000\n";

// Predicted seconds for copies[i] = {from, to} of `bytes` each, each on its
// own stream, all at once (after a copy of each that touches the memory).
double concurrent_copies(Engine& e, const std::vector<std::pair<int, int>>& copies, std::size_t bytes) {
  std::vector<weft::Block> blocks;
  std::vector<std::unique_ptr<gpu::StreamResources>> streams;
  for (auto [from, to] : copies) {
    blocks.push_back(e.allocator(Device::gpu(from)).allocate(bytes));
    blocks.push_back(e.allocator(Device::gpu(to)).allocate(bytes));
    streams.push_back(std::make_unique<gpu::StreamResources>(to, gpu::StreamRole::peer, 0));
  }
  auto copy_all = [&] {
    for (std::size_t i = 0; i < copies.size(); ++i)
      gpu::memcpy_peer_async(blocks[2 * i + 1].ptr, copies[i].second, blocks[2 * i].ptr, copies[i].first, bytes,
                             streams[i]->handles().stream);
    for (auto& s : streams) s->synchronize();
  };
  copy_all();
  const auto t0 = Clock::now();
  copy_all();
  const double wall = gpu::predicted_seconds(host_seconds_since(t0));
  for (std::size_t i = 0; i < copies.size(); ++i) {
    e.allocator(Device::gpu(copies[i].first)).free(std::move(blocks[2 * i]));
    e.allocator(Device::gpu(copies[i].second)).free(std::move(blocks[2 * i + 1]));
  }
  return wall;
}

}  // namespace

TEST_CASE("gpu sim model - copies share a link's bandwidth; across nodes they take the network's" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  WEFT_REQUIRE_GPUS(2);
  const TempFile profile("links.txt", kSlowLinks);
  const std::size_t bytes = std::size_t{8} << 20;  // 0.84 ms at 10 GB/s
  const double one = static_cast<double>(bytes) / 10e9 + 2e-6;
  const double dilation = 20;  // the memcpy of 8 MiB fits in the modeled time on the host clock
  {
    ModelScope model({.model = profile.path, .dilation = dilation});
    auto e = make_engine({.gpu_devices = 2});
    expect_near(concurrent_copies(*e, {{0, 1}}, bytes), one, 0.15, "one copy 0->1");
    expect_near(concurrent_copies(*e, {{0, 1}, {0, 1}}, bytes), 2 * one, 0.15, "two copies 0->1 at once");
    expect_near(concurrent_copies(*e, {{0, 1}, {1, 0}}, bytes), one, 0.15, "0->1 beside 1->0");
  }
  {
    ModelScope model({.model = profile.path, .gpus_per_node = 1, .dilation = dilation});
    auto e = make_engine({.gpu_devices = 2});
    expect_near(concurrent_copies(*e, {{0, 1}}, bytes), static_cast<double>(bytes) / 5e9 + 1e-3, 0.15,
                "one copy 0->1 across the node boundary");
  }
}

// A copy under gpu::ScopedUndefinedBytes (what ops/ and the GPU ring set
// for values no kernel computed) holds its link as long as any copy.
TEST_CASE("gpu sim model - a copy of undefined bytes takes its modeled time and moves nothing" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  CHECK_FALSE(gpu::copies_move_undefined_bytes());
  {
    gpu::ScopedUndefinedBytes outer;
    CHECK(gpu::copies_move_undefined_bytes());
    {
      gpu::ScopedUndefinedBytes inner(false);
      CHECK_FALSE(gpu::copies_move_undefined_bytes());
    }
    CHECK(gpu::copies_move_undefined_bytes());
  }
  CHECK_FALSE(gpu::copies_move_undefined_bytes());
  WEFT_REQUIRE_GPUS(2);  // the peer copy's part
  const TempFile profile("links.txt", kSlowLinks);
  const std::size_t bytes = std::size_t{8} << 20;  // 0.84 ms at 10 GB/s
  const double one = static_cast<double>(bytes) / 10e9 + 2e-6;
  ModelScope model({.model = profile.path, .dilation = 20});
  auto e = make_engine({.gpu_devices = 2});
  const gpu::SimModelStats before = gpu::sim_model_stats();
  double seconds = 0;
  {
    gpu::ScopedUndefinedBytes undefined;
    seconds = concurrent_copies(*e, {{0, 1}, {0, 1}}, bytes);
  }
  expect_near(seconds, 2 * one, 0.15, "two copies of undefined bytes 0->1 at once");
  const CopiedBytes c = copied_since(before);
  CHECK(c.skipped == 4 * bytes);  // two copies, twice
  CHECK(c.moved == 0);
}

namespace {

// Links for the ring: NVLink at 10 GB/s, 2 us; the network at 5 GB/s, 20 us.
const char* kRingLinks =
    "base h100\n"
    "nvlink_gbps 10\n"
    "nvlink_latency_us 2\n"
    "nic_gbps 5\n"
    "nic_latency_us 20\n";

// From the profiler's spans (modeled time under the mode): the first start
// to the last end of the GPU stream spans whose name contains `marker`.
double ring_seconds(const weft::Profiler& profiler, const std::string& marker) {
  std::int64_t first = 0, last = 0;
  bool any = false;
  for (const weft::Span& span : profiler.spans()) {
    if (span.kind != weft::TrackKind::stream || std::string(span.name).find(marker) == std::string::npos) continue;
    if (!any) first = span.start_ns, last = span.end_ns, any = true;
    first = std::min(first, span.start_ns);
    last = std::max(last, span.end_ns);
  }
  REQUIRE(any);
  return static_cast<double>(last - first) * 1e-9;
}

// The predicted seconds of a ring allreduce of `count` floats over gpu(0..n-1)
// of `e` under `model` (after a warm-up one at dilation 1 that allocates the
// scratch buffers).
double ring_allreduce_seconds(Engine& e, int n, std::int64_t count, gpu::SimModelOptions model) {
  std::vector<Device> members;
  for (int r = 0; r < n; ++r) members.push_back(Device::gpu(r));
  const par::Communicator comm = par::Communicator::local(e, members);
  std::vector<Tensor> t;
  for (int r = 0; r < n; ++r) t.push_back(Tensor::zeros(e, Shape{count}, Device::gpu(r)));
  const double dilation = model.dilation;
  model.dilation = 1;
  gpu::set_sim_model(model);
  par::allreduce(comm, t, par::ReduceOp::sum, {.name = "warm-up"});  // scratch buffers and first touches
  e.wait_all();
  model.dilation = dilation;
  gpu::set_sim_model(model);
  weft::Profiler& profiler = e.profiler();
  profiler.clear();
  profiler.start();
  par::allreduce(comm, t, par::ReduceOp::sum, {.name = "timed"});
  e.wait_all();
  profiler.stop();
  return ring_seconds(profiler, "'timed'");
}

}  // namespace

// Within a node every link is alike and each reduce-scatter step's add
// lies on the ring's path; over nodes the NIC is the slowest link, busy
// from the first step to the last, and the adds (and NVLink copies) of the
// GPUs between two NIC crossings hide behind it. A ring whose copies into one GPU were
// enqueued out of step order (a later step's copy ahead of an earlier
// one on the GPU's peer stream) takes whole steps longer.
TEST_CASE("gpu sim model - a ring allreduce takes 2(N-1)/N * S / B plus latencies" * doctest::timeout(300)) {
  WEFT_REQUIRE_SIM();
  const TempFile profile("ring.txt", kRingLinks);
  struct Config {
    int gpus, per_node;
    double dilation;
  };
  // S = 4 MiB. 2, 4 and 8 GPUs in one node; 16 in two nodes of 8 (needs
  // WEFT_SIM_GPUS=16). The time is read from the profiler's GPU spans,
  // whose modeled clock a late host thread does not move (a copy starts at
  // its modeled readiness, not when its thread wakes); only ops enqueued
  // later than the model needs them would, which the dilation prevents.
  const std::int64_t count = std::int64_t{1} << 20;
  for (const Config c : {Config{2, 0, 500}, Config{4, 0, 500}, Config{8, 0, 500}, Config{16, 8, 1000}}) {
    if (gpu::device_count() < c.gpus) {
      std::printf("ring allreduce over %d GPUs: only %d simulated GPUs (WEFT_SIM_GPUS)\n", c.gpus,
                  gpu::device_count());
      continue;
    }
    const int n = c.gpus;
    const gpu::SimModelOptions options{.model = profile.path, .gpus_per_node = c.per_node, .dilation = c.dilation};
    ModelScope model(options);
    auto e = make_engine({.cpu_devices = 1, .gpu_devices = n});
    const double s = static_cast<double>(count) * 4;
    const double steps = 2.0 * (n - 1);
    const bool nodes = c.per_node > 0 && c.per_node < n;
    const double bandwidth = nodes ? 5e9 : 10e9, latency = nodes ? 20e-6 : 2e-6;
    // An add: launch + 3 S/N bytes at memory bandwidth.
    const double add = 4e-6 + 3 * s / n / 3000e9;
    const double expected = steps / n * s / bandwidth + steps * latency + (nodes ? 0 : (n - 1) * add);
    const double predicted = ring_allreduce_seconds(*e, n, count, options);
    INFO(n << " GPUs" << (nodes ? " over nodes of 8" : " in one node") << ", S = " << s << " bytes");
    expect_near(predicted, expected, 0.1, "ring allreduce");
  }
}

TEST_CASE("gpu sim model - malformed profiles and cost tables name the file and the line" * doctest::timeout(60)) {
  WEFT_REQUIRE_SIM();
  auto expect_bad = [](const std::string& text, const std::string& where, const std::string& says) {
    const TempFile f("bad.txt", text);
    INFO(text);
    try {
      gpu::set_sim_model({.model = f.path});
      gpu::set_sim_model({});
      FAIL("accepted");
    } catch (const weft::InvalidArgument& err) {
      const std::string m = err.what();
      CHECK(m.find(f.path + where) != std::string::npos);
      CHECK(m.find(says) != std::string::npos);
    }
    CHECK(!gpu::kernels_modeled());
  };
  expect_bad("base h100\nfp32_tflops -5\n", ":2", "positive number");
  expect_bad("base h100\nmemory_gbps 0\n", ":2", "positive number");
  expect_bad("base h100\n\nwarp_speed 9\n", ":3", "unknown key 'warp_speed'");
  expect_bad("base h100\nlaunch_us\n", ":2", "want 'key value'");
  expect_bad("fp32_tflops 51\n", ":", "no 'tf32_tflops' line");
  expect_bad("weft-cost-table 1\nmatmul float32[2,2]\n", ":2", "want 'op shape microseconds'");
  expect_bad("weft-cost-table 1\nmatmul float32[2] -1\n", ":2", "non-negative number");
  expect_bad("weft-cost-table 1\nmatmul float32[2] 1\nmatmul float32[2] 2\n", ":3", "listed twice (first on line 2)");
  expect_bad("weft-cost-table 1\nprofile no-such-profile.txt\n", ":2", "its fallback profile");
  try {
    gpu::set_sim_model({.model = "no-such-gpu"});
    FAIL("accepted");
  } catch (const weft::InvalidArgument& err) {
    CHECK(std::string(err.what()).find("'no-such-gpu' is neither a built-in profile (h100)") != std::string::npos);
  }
}
