// The simulator's modeled mode (weft/gpu_sim.h), on simulated GPUs only: a
// modeled GEMM takes its modeled time, and a bf16 one the bf16 rate's, the
// same on an idle and on a busy host (virtual time); kernels of two streams
// of one GPU take turns on its SMs; a cost table's entry overrides
// the profile and a missing op falls back and is counted; reading a tensor a
// modeled kernel wrote is an error naming the mode, while real copies keep
// real values; copies of uncomputed values (and the ring's under the mode)
// move no bytes but take their modeled time; copies on one link follow
// one another, the other direction runs beside them, a copy across the
// node boundary takes the network's time and latency, and copies of two
// GPUs of a node cross nodes side by side on their own NICs (one shared
// NIC: in turn); a ring allreduce of S bytes over N GPUs (2, 4, 8 in a node,
// 4 one per node) takes 2(N-1)/N * S / B plus its latencies within 10%, and
// over two nodes of 8 the hierarchical allreduce its own sum of phases; the
// profiler's GPU spans are in modeled time; malformed profiles and tables
// name the file and the line.
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

struct Timed {
  double predicted = 0;  // gpu::modeled_now's advance over the pushes and wait_all
  double modeled = 0;    // seconds between events on the stream's modeled clock
};

// Keeps every core of a small machine busy while it lives.
struct BusyHost {
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  BusyHost() {
    for (int i = 0; i < 2; ++i)
      spinners.emplace_back([this] {
        while (!stop.load(std::memory_order_relaxed)) {
        }
      });
  }
  ~BusyHost() {
    stop = true;
    for (std::thread& t : spinners) t.join();
  }
};

// `count` chained n x n GEMMs on gpu(0) of `e` (one compute stream).
Timed chained_gemms(Engine& e, std::int64_t n, int count, weft::DType dtype) {
  Tensor a = Tensor::zeros(e, Shape{n, n}, Device::gpu(0), dtype);
  const Tensor b = Tensor::zeros(e, Shape{n, n}, Device::gpu(0), dtype);
  e.wait_all();
  gpu::TimingEvent start(0), end(0);
  const double t0 = gpu::modeled_now();
  record_after(a, start);
  for (int i = 0; i < count; ++i) a = ops::matmul(a, b);
  record_after(a, end);
  e.wait_all();
  Timed t;
  t.predicted = gpu::modeled_now() - t0;
  end.synchronize();
  t.modeled = end.ms_since(start) * 1e-3;
  return t;
}

// The profile's time of an n x n x n GEMM: launch, then the FLOPs at the
// peak rate times the fill of its n^2 outputs (fill_outputs 7e5).
double gemm_seconds(std::int64_t n, double tflops) {
  const double d = static_cast<double>(n), fill = d * d / (d * d + 7e5);
  return 4e-6 + 2.0 * d * d * d / (tflops * 1e12 * fill);
}

// Expects `measured` within `rel` of `expected` (host scheduling can only add).
void expect_near(double measured, double expected, double rel, const std::string& what) {
  INFO(what << ": measured " << measured * 1e3 << " ms, modeled " << expected * 1e3 << " ms");
  CHECK(measured >= expected * (1 - rel));
  CHECK(measured <= expected * (1 + rel));
}

}  // namespace

TEST_CASE("gpu sim model - a GEMM takes its modeled time, the same on a busy host" * doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  const std::int64_t n = 4096;
  ModelScope model({.model = "dgx-h100"});
  auto e = make_engine({.gpu_devices = 1, .compute_streams_per_gpu = 1});
  // 10 x 2.7 ms at 51 TFLOP/s (fp32); the host's clock starts them (a
  // launch each) and the frontend's wait ends where the last one does.
  const double expected = 10 * gemm_seconds(n, 51);
  const Timed idle = chained_gemms(*e, n, 10, weft::DType::float32);
  expect_near(idle.modeled, expected, 0.05, "fp32, between the events before the first and after the last");
  expect_near(idle.predicted, expected, 0.05, "fp32, modeled_now across the pushes and wait_all");
  {
    // Virtual time: a loaded host changes nothing (a dilated sleep would
    // have added its late wake-ups).
    BusyHost busy;
    const Timed loaded = chained_gemms(*e, n, 10, weft::DType::float32);
    CHECK(std::abs(loaded.predicted - idle.predicted) <= 1e-9 * idle.predicted + 1e-9);
    CHECK(std::abs(loaded.modeled - idle.modeled) <= 1e-6);
  }
  // bf16 at 790 TFLOP/s: 20 x 0.18 ms.
  expect_near(chained_gemms(*e, n, 20, weft::DType::bfloat16).predicted, 20 * gemm_seconds(n, 790), 0.05,
              "bf16, modeled_now");
  CHECK(gpu::sim_model_stats().kernels >= 40);
  CHECK(gpu::modeled_issue_time() >= 0);
}

// The engine's profiler under the mode: GPU stream spans are in modeled
// time (not dilated), and so is the summary's busy time of the stream.
TEST_CASE("gpu sim model - the profiler's GPU spans take the modeled time" * doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  const std::int64_t n = 4096;
  ModelScope model({.model = "dgx-h100"});
  auto e = make_engine({.gpu_devices = 1, .compute_streams_per_gpu = 1});
  Tensor a = Tensor::zeros(*e, Shape{n, n}, Device::gpu(0));
  const Tensor b = Tensor::zeros(*e, Shape{n, n}, Device::gpu(0));
  e->wait_all();
  weft::Profiler& profiler = e->profiler();
  profiler.start();
  const int count = 5;
  for (int i = 0; i < count; ++i) a = ops::matmul(a, b);
  e->wait_all();
  profiler.stop();
  const double expected = gemm_seconds(n, 51);  // 2.7 ms at 51 TFLOP/s (fp32)
  int spans = 0;
  for (const weft::Span& span : profiler.spans()) {
    if (span.kind != weft::TrackKind::stream || std::string(span.name).find("matmul") == std::string::npos) continue;
    ++spans;
    expect_near(static_cast<double>(span.end_ns - span.start_ns) * 1e-9, expected, 0.05, "a GEMM's stream span");
  }
  CHECK(spans == count);
  double busy_ms = 0;
  for (const weft::ResourceUsage& r : profiler.summarize().resources)
    if (r.kind == weft::TrackKind::stream && r.device == Device::gpu(0)) busy_ms += r.busy_ms;
  expect_near(busy_ms * 1e-3, count * expected, 0.05, "the GPU streams' busy time in the summary");
}

TEST_CASE("gpu sim model - kernels of two streams of a GPU take turns on its SMs, and no thread sleeps" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  ModelScope model({.model = "dgx-h100"});
  const gpu::StreamResources s1(0, gpu::StreamRole::compute, 0), s2(0, gpu::StreamRole::compute, 0);
  // 10 kernels of 5 ms (2.55e11 FLOP at 51 TFLOP/s, plus the launch) on each stream.
  const gpu::KernelCost cost{"test gemm", "-", 5e-3 * 51e12, 0, gpu::Math::fp32};
  gpu::ScopedWaitCause frontend(gpu::WaitCause::frontend);  // its waits move modeled_now
  // The modeled time of 10 kernels on each of two streams, launched in turn.
  auto side_by_side = [&cost](const gpu::StreamResources& a, const gpu::StreamResources& b) {
    const double t0 = gpu::modeled_now();
    for (int i = 0; i < 10; ++i) {
      gpu::launch_modeled_kernel(a.handles().stream, cost);
      gpu::launch_modeled_kernel(b.handles().stream, cost);
    }
    a.synchronize();
    b.synchronize();
    return gpu::modeled_now() - t0;
  };
  const auto wall0 = Clock::now();
  const double predicted = side_by_side(s1, s2);
  const double wall = host_seconds_since(wall0);
  // One GPU's SMs run one kernel at a time: 20 x 5 ms, not two streams of 50 ms side by side.
  const double kernel = 5e-3 + 4e-6;
  INFO("two streams of 10 x 5 ms: predicted " << predicted * 1e3 << " ms, " << wall * 1e3 << " ms on the host clock");
  expect_near(predicted, 20 * kernel, 0.02, "two streams sharing the SMs");
  CHECK(wall < 20 * kernel);  // virtual time: the host did not wait for it
  // Another GPU's SMs are its own.
  const gpu::StreamResources s3(1 % gpu::device_count(), gpu::StreamRole::compute, 0);
  if (gpu::device_count() > 1) expect_near(side_by_side(s1, s3), 10 * kernel, 0.02, "two GPUs side by side");
}

TEST_CASE("gpu sim model - a cost table overrides the profile, and a missing op falls back and is counted" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  const std::string key = "float32[256,256];float32[256,256]->float32[256,256]";
  const TempFile table("table.txt", "weft-cost-table 1\nprofile dgx-h100  # fallback\n"
                                    "# op shape microseconds\n"
                                    "matmul " + key + " 3000\n"
                                    "cast to bfloat16 float32[4]->bfloat16[4] 1\n");
  ModelScope model({.model = table.path});
  CHECK(gpu::modeled_kernel_seconds({"matmul", key, 1, 0, gpu::Math::fp32}) == doctest::Approx(3e-3));
  auto e = make_engine({.gpu_devices = 1, .compute_streams_per_gpu = 1});
  expect_near(chained_gemms(*e, 256, 5, weft::DType::float32).modeled, 5 * 3e-3, 0.05,
              "5 GEMMs the table times at 3 ms");
  const gpu::SimModelStats before = gpu::sim_model_stats();
  CHECK(before.fallbacks == 2);  // the two zeros(): "full" is not in the table
  const Tensor a = Tensor::zeros(*e, Shape{128, 128}, Device::gpu(0));
  const Tensor c = ops::matmul(a, a);
  c.wait_to_read();
  const gpu::SimModelStats after = gpu::sim_model_stats();
  CHECK(after.from_table == before.from_table);
  CHECK(after.fallbacks == before.fallbacks + 2);
  CHECK(after.missing.at("matmul float32[128,128];float32[128,128]->float32[128,128]") == 1);
  CHECK(gpu::sim_model_report().find("fell back to the profile dgx-h100") != std::string::npos);
}

TEST_CASE("gpu sim model - reading a tensor a modeled kernel wrote is an error naming the mode" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  ModelScope model({.model = "dgx-h100"});
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
      CHECK(m.find("WEFT_SIM_MODEL=dgx-h100") != std::string::npos);
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

TEST_CASE("gpu sim model - copies of uncomputed values move no bytes, copies of host data stay exact" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  ModelScope model({.model = "dgx-h100"});
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
    "base dgx-h100\n"
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
  gpu::ScopedWaitCause frontend(gpu::WaitCause::frontend);  // its waits move modeled_now
  copy_all();
  const double t0 = gpu::modeled_now();
  copy_all();
  const double wall = gpu::modeled_now() - t0;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    e.allocator(Device::gpu(copies[i].first)).free(std::move(blocks[2 * i]));
    e.allocator(Device::gpu(copies[i].second)).free(std::move(blocks[2 * i + 1]));
  }
  return wall;
}

}  // namespace

TEST_CASE("gpu sim model - copies share a link's bandwidth, across nodes they take the network's" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  WEFT_REQUIRE_GPUS(2);
  const TempFile profile("links.txt", kSlowLinks);
  const std::size_t bytes = std::size_t{8} << 20;  // 0.84 ms at 10 GB/s
  const double one = static_cast<double>(bytes) / 10e9 + 2e-6;
  {
    ModelScope model({.model = profile.path});
    auto e = make_engine({.gpu_devices = 2});
    expect_near(concurrent_copies(*e, {{0, 1}}, bytes), one, 0.15, "one copy 0->1");
    expect_near(concurrent_copies(*e, {{0, 1}, {0, 1}}, bytes), 2 * one, 0.15, "two copies 0->1 at once");
    expect_near(concurrent_copies(*e, {{0, 1}, {1, 0}}, bytes), one, 0.15, "0->1 beside 1->0");
  }
  {
    ModelScope model({.model = profile.path, .gpus_per_node = 1});
    auto e = make_engine({.gpu_devices = 2});
    expect_near(concurrent_copies(*e, {{0, 1}}, bytes), static_cast<double>(bytes) / 5e9 + 1e-3, 0.15,
                "one copy 0->1 across the node boundary");
  }
}

// A fabric oversubscribed 2:1 halves a NIC's rate between nodes. A
// DGX-like node has a NIC per GPU (rail-optimized): GPU 0 and GPU 1 of one
// node send to the next node side by side; one NIC per node (a profile's
// nics_per_node 1) takes them in turn. That part needs four GPUs: its own
// case, which gpu.sim_model.ring16 runs.
TEST_CASE("gpu sim model - a fabric oversubscribed 2:1 halves the rate of a copy that crosses nodes" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  WEFT_REQUIRE_GPUS(2);
  const std::size_t bytes = std::size_t{8} << 20;
  {
    const TempFile profile("oversubscribed.txt", std::string(kSlowLinks) + "fabric_oversubscription 2\n");
    ModelScope model({.model = profile.path, .gpus_per_node = 1});
    auto e = make_engine({.gpu_devices = 2});
    expect_near(concurrent_copies(*e, {{0, 1}}, bytes), static_cast<double>(bytes) / 2.5e9 + 1e-3, 0.15,
                "0->1 across a 2:1 oversubscribed fabric");
  }
}

TEST_CASE("gpu sim model - two nodes of two: a GPU crosses nodes on its own NIC, one shared NIC takes copies in turn" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_SIM();
  WEFT_REQUIRE_GPUS(4);  // gpu.sim_model.ring16 runs it on 16
  const std::size_t bytes = std::size_t{8} << 20;
  const double one = static_cast<double>(bytes) / 5e9 + 1e-3;
  {
    const TempFile profile("rails.txt", std::string(kSlowLinks));  // eight NICs per node (dgx-h100's)
    ModelScope model({.model = profile.path, .gpus_per_node = 2});
    auto e = make_engine({.gpu_devices = 4});
    expect_near(concurrent_copies(*e, {{0, 2}, {1, 3}}, bytes), one, 0.15, "0->2 beside 1->3, a NIC each");
  }
  {
    const TempFile profile("one-nic.txt", std::string(kSlowLinks) + "nics_per_node 1\n");
    ModelScope model({.model = profile.path, .gpus_per_node = 2});
    auto e = make_engine({.gpu_devices = 4});
    expect_near(concurrent_copies(*e, {{0, 2}, {1, 3}}, bytes), 2 * one - 1e-3, 0.15, "0->2 and 1->3 through one NIC");
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
  ModelScope model({.model = profile.path});
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
    "base dgx-h100\n"
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

// The predicted seconds of an allreduce of `count` floats over gpu(0..n-1)
// of `e` (after a warm-up one that allocates the scratch buffers).
double ring_allreduce_seconds(Engine& e, int n, std::int64_t count) {
  std::vector<Device> members;
  for (int r = 0; r < n; ++r) members.push_back(Device::gpu(r));
  const par::Communicator comm = par::Communicator::local(e, members);
  std::vector<Tensor> t;
  for (int r = 0; r < n; ++r) t.push_back(Tensor::zeros(e, Shape{count}, Device::gpu(r)));
  par::allreduce(comm, t, par::ReduceOp::sum, {.name = "warm-up"});  // scratch buffers and first touches
  e.wait_all();
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
// lies on the ring's path; so with one GPU per node over the NICs. Over two
// nodes of 8, the hierarchical allreduce: a ring reduce-scatter inside each
// node, a ring allreduce of each GPU's region with its rail peer, a ring
// all-gather inside the node, one phase after the other. A ring whose copies
// into one GPU were enqueued out of step order (a later step's copy ahead
// of an earlier one on the GPU's peer stream) takes whole steps longer.
TEST_CASE("gpu sim model - a ring allreduce takes 2(N-1)/N * S / B plus latencies, across nodes the hierarchy its phases" *
          doctest::timeout(300)) {
  WEFT_REQUIRE_SIM();
  const TempFile profile("ring.txt", kRingLinks);
  struct Config {
    int gpus, per_node;
  };
  // S = 4 MiB. 2, 4 and 8 GPUs in one node; 4 GPUs one per node; 16 in
  // two nodes of 8 (needs WEFT_SIM_GPUS=16). Read from the profiler's GPU
  // spans.
  const std::int64_t count = std::int64_t{1} << 20;
  const double s = static_cast<double>(count) * 4;
  auto add = [](double bytes) { return 4e-6 + 3 * bytes / 3000e9; };  // launch + 3 bytes at memory bandwidth
  for (const Config c : {Config{2, 8}, Config{4, 8}, Config{8, 8}, Config{4, 1}, Config{16, 8}}) {
    if (gpu::device_count() < c.gpus) {
      std::printf("allreduce over %d GPUs: only %d simulated GPUs (WEFT_SIM_GPUS)\n", c.gpus, gpu::device_count());
      continue;
    }
    const int n = c.gpus;
    ModelScope model({.model = profile.path, .gpus_per_node = c.per_node});
    auto e = make_engine({.cpu_devices = 1, .gpu_devices = n});
    double expected;
    if (c.per_node == 1 || n <= c.per_node) {  // the ring, every link alike
      const double b = c.per_node == 1 ? 5e9 : 10e9, latency = c.per_node == 1 ? 20e-6 : 2e-6;
      const double steps = 2.0 * (n - 1);
      expected = steps / n * s / b + steps * latency + (n - 1) * add(s / n);
    } else {  // two nodes of g: the node phases over NVLink, the rail phase over the NICs
      const int g = c.per_node, m = n / g;
      const double node_step = s / g / 10e9 + 2e-6, rail_step = s / g / m / 5e9 + 20e-6;
      expected = (g - 1) * (node_step + add(s / g)) + (m - 1) * (rail_step + add(s / g / m)) + (m - 1) * rail_step +
                 (g - 1) * node_step;
    }
    const double predicted = ring_allreduce_seconds(*e, n, count);
    INFO(n << " GPUs, " << c.per_node << " per node, S = " << s << " bytes");
    expect_near(predicted, expected, 0.1, "allreduce");
    if (n > c.per_node && c.per_node > 1) {
      bool named = false;
      for (const auto& [key, text] : weft::Profiler::notes())
        named = named || (key.find("'timed'") != std::string::npos && text.rfind("hierarchical", 0) == 0);
      CHECK(named);  // the choice is in the profile's notes
    }
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
  expect_bad("base dgx-h100\nfp32_tflops -5\n", ":2", "positive number");
  expect_bad("base dgx-h100\nmemory_gbps 0\n", ":2", "positive number");
  expect_bad("base dgx-h100\nnic_gbps 0\n", ":2", "positive number");
  expect_bad("base dgx-h100\n\nwarp_speed 9\n", ":3", "unknown key 'warp_speed'");
  expect_bad("base dgx-h100\nlaunch_us\n", ":2", "want 'key value'");
  expect_bad("base h100\n", ":1", "'base' takes a built-in profile (dgx-h100, dgx-h200, dgx-a100)");
  expect_bad("base dgx-h100\ngpus_per_node 4\nnics_per_node 8\n", ":3", "give 'nic_affinity'");
  expect_bad("base dgx-h100\ngpus_per_node 4\nnics_per_node 2\nnic_affinity 0,1 1,2,3\n", ":4",
             "GPU 1 is served by NIC 0 and NIC 1");
  expect_bad("base dgx-h100\ngpus_per_node 4\nnics_per_node 2\nnic_affinity 0,1 2\n", ":4",
             "lists GPUs 0-2 for 4 GPUs per node");
  expect_bad("base dgx-h100\ngpus_per_node 2.5\n", ":2", "whole number");
  expect_bad("base dgx-h100\nfabric_oversubscription 0.5\n", ":2", "at least 1");
  expect_bad("fp32_tflops 51\n", ":", "no 'tf32_tflops' line");
  expect_bad("weft-cost-table 1\nmatmul float32[2,2]\n", ":2", "want 'op shape microseconds'");
  expect_bad("weft-cost-table 1\nmatmul float32[2] -1\n", ":2", "non-negative number");
  expect_bad("weft-cost-table 1\nmatmul float32[2] 1\nmatmul float32[2] 2\n", ":3", "listed twice (first on line 2)");
  expect_bad("weft-cost-table 1\nprofile no-such-profile.txt\n", ":2", "its fallback profile");
  try {
    gpu::set_sim_model({.model = "no-such-gpu"});
    FAIL("accepted");
  } catch (const weft::InvalidArgument& err) {
    CHECK(std::string(err.what()).find("'no-such-gpu' is neither a built-in profile (dgx-h100, dgx-h200, dgx-a100)") != std::string::npos);
  }
}
