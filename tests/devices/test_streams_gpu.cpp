// Stream-ordered completion under load: a random program over many tensors
// on four compute streams and the copy streams gives the CPU engine's
// results; copies overlap compute; and the engine completes GPU ops when they
// are enqueued, long before the GPU has run them (no worker ever waits for a
// stream).
#include <algorithm>
#include <thread>

#include "gpu_test_util.h"

using namespace gputest;
namespace ops = weft::ops;

namespace {

// The program on `gpus` GPUs (their compute streams, h2d/d2h/peer copy
// streams) and the CPU, against the same program on CPU devices only. GPU
// workers must never wait on the host for the GPU: every GPU->GPU dependency
// is a stream wait (host waits are counted by cause in the backend).
void stress(std::size_t instructions, std::uint64_t seed, ProgramOptions opt, int gpus = 1) {
  const std::vector<Instr> program = make_program(instructions, seed, opt.slots);
  if (simulated()) opt.noise_side = std::min<std::int64_t>(opt.noise_side, 192);  // CPU kernels at CPU speed

  std::vector<Device> ref_devs, gpu_devs;
  for (int g = 0; g < gpus; ++g) {
    ref_devs.push_back(Device::cpu(1 + g));
    gpu_devs.push_back(Device::gpu(g));
  }
  ProgramResult want;
  {
    // The reference: the same program with the "devices" being more CPUs.
    auto cpu = make_engine({.kind = "threaded", .cpu_devices = 1 + gpus, .gpu_devices = 0});
    ProgramOptions ref = opt;
    ref.noise_every = 0;
    want = run_program(*cpu, program, ref_devs, Device::cpu(0), ref);
  }
  auto gpu = make_engine({.kind = "threaded", .gpu_devices = gpus, .compute_streams_per_gpu = 4});
  REQUIRE(gpu->workers(Device::gpu(0)) == 4);
  const weft::gpu::HostWaits before = weft::gpu::host_waits();
  const auto t0 = Clock::now();
  const ProgramResult got = run_program(*gpu, program, gpu_devs, Device::cpu(0), opt);
  const double seconds = seconds_since(t0);
  const weft::gpu::HostWaits after = weft::gpu::host_waits();
  auto delta = [&](weft::gpu::WaitCause c) { return after.of(c) - before.of(c); };
  MESSAGE("stress: " << instructions << " instructions over " << 2 * opt.slots << " tensors of [" << opt.side << ", "
                     << opt.side << "] on " << gpus << " GPU(s) (" << weft::gpu::describe(0) << ") ran in " << seconds
                     << " s; host waits: cpu workers " << delta(weft::gpu::WaitCause::cpu_worker) << ", frontend "
                     << delta(weft::gpu::WaitCause::frontend) << ", gpu workers "
                     << delta(weft::gpu::WaitCause::gpu_worker));
  compare_runs(got, want, 1e-4, 2e-5, "gpu vs cpu reference");
  // CPU ops reading GPU results do wait (the program has plenty of them)...
  CHECK(delta(weft::gpu::WaitCause::cpu_worker) > 0);
  // ...GPU workers never do.
  CHECK(delta(weft::gpu::WaitCause::gpu_worker) == 0);
}

}  // namespace

TEST_CASE("gpu streams - cross-stream stress small tensors matches cpu" * doctest::timeout(240)) {
  WEFT_REQUIRE_GPU();
  stress(2000, 20240601, ProgramOptions{.side = 32, .slots = 16, .noise_every = 25, .noise_side = 2048});
}

TEST_CASE("gpu streams - cross-stream stress larger tensors matches cpu" * doctest::timeout(240)) {
  WEFT_REQUIRE_GPU();
  stress(600, 777, ProgramOptions{.side = 256, .slots = 16, .noise_every = 10, .noise_side = 2048});
}

TEST_CASE("gpu streams - two-gpu stress with peer copies matches cpu for several seeds" * doctest::timeout(300)) {
  WEFT_REQUIRE_GPU();
  if (weft::gpu::device_count() < 2) {
    std::printf("[weft-skip] needs 2 GPUs, %d answer(s)\n", weft::gpu::device_count());
    return;
  }
  for (std::uint64_t seed : {11ull, 29ull, 4099ull}) {
    INFO("program seed " << seed);
    stress(1500, seed, ProgramOptions{.side = 24, .slots = 24, .noise_every = 40, .noise_side = 2048}, 2);
  }
}

TEST_CASE("gpu streams - copies overlap compute" * doctest::timeout(300)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = 2});
  // Simulated GPUs compute at CPU speed: smaller work, the same pattern.
  const std::int64_t m = simulated() ? 384 : 4096;                 // m^3 multiply-adds per matmul
  const std::int64_t copy_n = simulated() ? 1 << 20 : 32 << 20;    // 4 MiB / 128 MiB per copy
  const int count = 12;
  const Device gpu = Device::gpu(0);

  const std::vector<float> a_host = random_values(static_cast<std::size_t>(m * m), 3);
  std::vector<float> eye_host(static_cast<std::size_t>(m * m), 0.0f);
  for (std::int64_t i = 0; i < m; ++i) eye_host[static_cast<std::size_t>(i * m + i)] = 1.0f;
  const Tensor a = Tensor::from_host(*e, Shape{m, m}, a_host, gpu);
  const Tensor eye = Tensor::from_host(*e, Shape{m, m}, eye_host, gpu);
  std::vector<Tensor> src, dst;
  for (int i = 0; i < count; ++i) {
    src.push_back(Tensor::uniform(*e, Shape{copy_n}, -1.0f, 1.0f, 100 + static_cast<std::uint64_t>(i), gpu));
    dst.push_back(Tensor::empty(*e, Shape{copy_n}, Device::cpu_pinned(0)));
  }

  std::vector<Tensor> products;
  auto compute = [&] {
    for (int i = 0; i < count; ++i) products.push_back(ops::matmul(a, eye));
  };
  auto copies = [&] {
    for (int i = 0; i < count; ++i) dst[static_cast<std::size_t>(i)].copy_from(src[static_cast<std::size_t>(i)]);
  };
  auto both = [&] {
    for (int i = 0; i < count; ++i) {
      products.push_back(ops::matmul(a, eye));
      dst[static_cast<std::size_t>(i)].copy_from(src[static_cast<std::size_t>(i)]);
    }
  };
  auto timed = [&](auto&& phase) {
    products.clear();
    e->wait_all();
    const auto t0 = Clock::now();
    phase();
    e->wait_all();
    return seconds_since(t0);
  };
  // Warm-up: cuBLAS picks its kernels, the allocator caches blocks on each stream.
  for (int i = 0; i < 2; ++i) {
    timed(both);
    timed(compute);
  }
  double t_compute = 1e30, t_copies = 1e30, t_both = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    t_compute = std::min(t_compute, timed(compute));
    t_copies = std::min(t_copies, timed(copies));
    e->profiler().clear();
    e->profiler().start();
    t_both = std::min(t_both, timed(both));
    e->profiler().stop();
  }
  const double efficiency = (t_compute + t_copies - t_both) / std::min(t_compute, t_copies);
  std::printf("overlap: compute alone %.2f ms, copies alone %.2f ms, interleaved %.2f ms; efficiency %.2f "
              "(1 = the shorter phase fully hidden, 0 = serialized)\n",
              t_compute * 1e3, t_copies * 1e3, t_both * 1e3, efficiency);
  MESSAGE("overlap: compute " << t_compute * 1e3 << " ms, copies " << t_copies * 1e3 << " ms, both " << t_both * 1e3
                              << " ms, efficiency " << efficiency);

  // The engine traced every op of the interleaved phase on the GPU's tracks.
  std::size_t matmul_spans = 0, copy_spans = 0;
  for (const weft::Span& s : e->profiler().spans()) {
    if (s.device != gpu) continue;
    matmul_spans += s.name == "matmul";
    copy_spans += s.name == "copy gpu(0)->cpu_pinned(0)";
  }
  CHECK(matmul_spans >= static_cast<std::size_t>(count));
  CHECK(copy_spans >= static_cast<std::size_t>(count));

  // The work was right: A * I == A (to TF32's rounding, should cuBLAS use it),
  // and each pinned destination holds its source.
  REQUIRE(products.size() == static_cast<std::size_t>(count));
  expect_close(products.front().to_host(), a_host, 1e-3, 0, "first product");
  expect_close(products.back().to_host(), a_host, 1e-3, 0, "last product");
  for (int i : {0, count - 1})
    expect_bits_equal(dst[static_cast<std::size_t>(i)].to_host(), src[static_cast<std::size_t>(i)].to_host(),
                      "pinned copy " + std::to_string(i));
  e->wait_all();
}

TEST_CASE("gpu streams - ops complete when enqueued and no worker waits for the gpu" * doctest::timeout(300)) {
  WEFT_REQUIRE_GPU();
  // One compute stream: the chain runs back to back on it.
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = 1});
  // ~58 GFLOP per matmul: ~1 ms on an H100, far more than the ~10-50 us to
  // enqueue it (simulated: ~30 MFLOP, milliseconds of CPU time each).
  const std::int64_t n = simulated() ? 256 : 3072;
  const int chain = simulated() ? 100 : 200;
  const Device gpu = Device::gpu(0);
  // Scaled so that x * b keeps x's magnitude (b's columns have norm ~1).
  const Tensor b = Tensor::normal(*e, Shape{n, n}, 0.0f, 1.0f / std::sqrt(static_cast<float>(n)), 5, gpu);
  Tensor x = Tensor::uniform(*e, Shape{n, n}, -1.0f, 1.0f, 6, gpu);
  for (int i = 0; i < 3; ++i) x = ops::matmul(x, b);  // warm-up: cuBLAS's choice, cached blocks
  e->wait_all();

  const auto t0 = Clock::now();
  for (int i = 0; i < chain; ++i) x = ops::matmul(x, b);
  const double t_pushed = seconds_since(t0);
  // Poll the engine's own accounting (no wait: a wait would block on the GPU).
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (e->inflight() != 0 && Clock::now() < deadline) std::this_thread::yield();
  const double t_engine = seconds_since(t0);
  REQUIRE(e->inflight() == 0);
  e->wait_all();
  const double t_gpu = seconds_since(t0);

  std::printf("stream-ordered completion: %d chained %lldx%lld matmuls pushed in %.2f ms, completed by the engine "
              "after %.2f ms, finished on the GPU after %.2f ms\n",
              chain, static_cast<long long>(n), static_cast<long long>(n), t_pushed * 1e3, t_engine * 1e3,
              t_gpu * 1e3);
  MESSAGE("pushed " << t_pushed * 1e3 << " ms, engine done " << t_engine * 1e3 << " ms, gpu done " << t_gpu * 1e3
                    << " ms");
  // Workers that synchronized a stream per op would finish with the GPU.
  CHECK(t_engine < 0.5 * t_gpu);

  const std::vector<float> v = x.to_host();
  std::size_t finite = 0;
  for (float f : v) finite += std::isfinite(f);
  CHECK(finite == v.size());
  CHECK(mean_abs(v) > 1e-3);
}

// More ops than a stream keeps unresolved spans for (kMaxPending, 16,384)
// between two wait_alls, as a training epoch pushes: every GPU-side span
// still reaches the profiler, in stream order, none dropped past the bound.
// A wait_to_read every 1,000 ops, as a training loop reads its loss each
// step, keeps the stream from falling 16,384 ops behind
// (the bound for spans still queued: CUDA blocks the launching thread far
// earlier, a simulated GPU under a sanitizer does not).
TEST_CASE("gpu streams - profiling more ops than spans wait per stream keeps every GPU-side span" *
          doctest::timeout(300)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = 1});
  const Device gpu = Device::gpu(0);
  constexpr int kOps = 20000;
  Tensor x = Tensor::zeros(*e, Shape{16}, gpu);
  e->wait_all();
  e->profiler().clear();
  e->profiler().start();
  for (int i = 0; i < kOps; ++i) {
    x = weft::ops::add_scalar(x, 1.0f);
    if (i % 1000 == 999) x.wait_to_read();  // not wait_all: spans are resolved at the end only
  }
  e->wait_all();
  e->profiler().stop();
  std::vector<std::int64_t> starts;
  for (const weft::Span& s : e->profiler().spans())
    if (s.device == gpu && s.track < 1000 && s.name == "add_scalar") starts.push_back(s.start_ns);
  CHECK(starts.size() == static_cast<std::size_t>(kOps));
  CHECK(std::is_sorted(starts.begin(), starts.end()));
  CHECK(x.to_host() == std::vector<float>(16, static_cast<float>(kOps)));
}
