// Shared helpers of the GPU tests: the skip guard, host data, comparisons with
// tolerances, and a random tensor program that runs unchanged on any pair of
// devices (used to compare a GPU engine with a CPU-only one, and engine kinds
// with each other).
//
// Every test case starts with WEFT_REQUIRE_GPU(): where no GPU answers — no
// real GPU, and no simulated one (WEFT_GPU_BACKEND=sim, as ctest runs these
// tests) — it prints "[weft-skip] ..." and returns, which ctest reports as
// skipped.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "test_workers.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/gpu.h"
#include "weft/gpu_streams.h"
#include "weft/nn_ops.h"
#include "weft/ops.h"
#include "weft/tensor.h"

#define WEFT_REQUIRE_GPU()                                                                        \
  do {                                                                                            \
    if (::weft::gpu::device_count() == 0) {                                                       \
      std::printf("[weft-skip] no GPU answers (%s backend; WEFT_GPU_BACKEND=sim simulates GPUs)\n", \
                  std::string(::weft::gpu::to_string(::weft::gpu::backend())).c_str());           \
      std::fflush(stdout);                                                                        \
      return;                                                                                     \
    }                                                                                             \
  } while (0)

// As WEFT_REQUIRE_GPU, for a case that needs at least `n` GPUs.
#define WEFT_REQUIRE_GPUS(n)                                                                              \
  do {                                                                                                    \
    WEFT_REQUIRE_GPU();                                                                                   \
    if (::weft::gpu::device_count() < (n)) {                                                              \
      std::printf("[weft-skip] %d GPU(s) answer, this case needs %d\n", ::weft::gpu::device_count(), (n)); \
      std::fflush(stdout);                                                                                \
      return;                                                                                             \
    }                                                                                                     \
  } while (0)

namespace gputest {

// Simulated GPUs run CPU kernels at CPU speed: tests that need GPU-sized work
// to mean anything (overlap, stream-ordered completion) scale it by this.
inline bool simulated() { return weft::gpu::device_count() > 0 && weft::gpu::properties(0).simulated; }

// GPU members of an in-process group: every GPU, at most 4.
inline int member_gpus() { return std::min(weft::gpu::device_count(), 4); }

using weft::Device;
using weft::Engine;
using weft::EngineConfig;
using weft::Shape;
using weft::Tensor;

inline std::unique_ptr<Engine> make_engine(EngineConfig config = {}) {
  if (config.kind.empty()) config.kind = "threaded";
  return Engine::create(std::move(config));
}

// Each scenario on fresh engines with `gpus` GPUs and `cpu_devices` CPU
// devices: naive, and threaded at 1, 2, 4 and 8 workers per CPU device and
// compute streams per GPU; then no GPU worker may have waited on the host.
template <class F>
void with_each_gpu_engine(int gpus, F&& fn, int cpu_devices = 1) {
  const std::uint64_t gpu_worker_waits = weft::gpu::host_waits().of(weft::gpu::WaitCause::gpu_worker);
  {
    INFO("naive engine");
    auto e = make_engine({.kind = "naive", .cpu_devices = cpu_devices, .gpu_devices = gpus});
    fn(*e);
    e->wait_all();
  }
  for (int workers : weft_test::worker_counts()) {
    INFO("threaded engine, " << workers << " workers per device");
    auto e = make_engine({.kind = "threaded", .cpu_devices = cpu_devices, .workers_per_cpu_device = workers,
                          .gpu_devices = gpus, .compute_streams_per_gpu = workers});
    fn(*e);
    e->wait_all();
  }
  CHECK(weft::gpu::host_waits().of(weft::gpu::WaitCause::gpu_worker) == gpu_worker_waits);
}

// Deterministic host data (splitmix64), independent of the library's RNG.
inline std::uint64_t splitmix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Rng {
  std::uint64_t state;
  explicit Rng(std::uint64_t seed) : state(seed * 0x2545F4914F6CDD1Dull + 1) {}
  std::uint64_t next() { return splitmix(state); }
  // [0, n)
  std::int64_t below(std::int64_t n) { return n <= 0 ? 0 : static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n)); }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * (static_cast<float>(next() >> 40) * (1.0f / 16777216.0f));
  }
  bool coin() { return (next() & 1u) != 0; }
};

inline std::vector<float> random_values(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v)
    if (std::isfinite(x)) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

inline double mean_abs(const std::vector<float>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (float x : v) s += std::fabs(static_cast<double>(x));
  return s / static_cast<double>(v.size());
}

// |got - want| <= atol + rtol * |want| element by element; NaN matches NaN,
// an infinity only itself. Reports the count and the first few mismatches.
inline bool expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol,
                         const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  double worst = 0;
  std::string first;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    if (std::isnan(w) || std::isnan(g))
      ok = std::isnan(w) && std::isnan(g);
    else if (std::isinf(w) || std::isinf(g))
      ok = g == w;
    else {
      const double diff = std::fabs(g - w);
      ok = diff <= atol + rtol * std::fabs(w);
      worst = std::max(worst, diff);
    }
    if (!ok) {
      if (bad < 5) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "  [%zu] got %.9g want %.9g\n", i, g, w);
        first += buf;
      }
      ++bad;
    }
  }
  if (bad) {
    char head[200];
    std::snprintf(head, sizeof head, "%zu of %zu elements differ (rtol %g, atol %g, largest difference %g):\n", bad,
                  got.size(), rtol, atol, worst);
    const std::string msg = std::string(head) + first;
    FAIL_CHECK(msg);
  }
  return bad == 0;
}

// Tolerance scaled to the result's magnitude: for sums that cuBLAS, cuDNN
// and the CPU kernels add in different orders, an element near zero can carry
// the rounding of much larger terms.
inline bool expect_close_scaled(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                                const std::string& what) {
  return expect_close(got, want, rtol, rtol * std::max(1e-6, max_abs(want)), what);
}

// Bit for bit (NaN payloads and signed zeros included).
inline bool expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a != b && bad++ == 0) first = i;
  }
  if (bad) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%zu of %zu elements differ in their bits; first at %zu: got %.9g want %.9g", bad,
                  got.size(), first, static_cast<double>(got[first]), static_cast<double>(want[first]));
    FAIL_CHECK(buf);
  }
  return bad == 0;
}

inline std::size_t count_bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- a random tensor program ----------------------------------------------
//
// `dev` slots live on the device under test (gpu(0), or cpu(1) in the CPU
// reference), `host` slots on cpu(0). The instructions mix compute ops on the
// device (new outputs and in-place writes), copies in both directions (on a
// GPU: the h2d/d2h copy streams, staged through pinned memory), copies into
// existing tensors, host ops on copied-back data, reductions, and fresh data.
// Values stay within [-1, 1] (every op is an average, a product of values in
// [-1, 1], or scaled to keep the bound), so the comparison stays meaningful.
enum class Step : std::uint8_t {
  dev_avg, dev_mul, dev_axpy, dev_sgd, dev_matmul, dev_sub_relu, dev_mean, dev_copy, dev_fresh,
  to_host, to_dev, copy_into_dev, copy_into_host, pinned_round_trip,
  host_avg, host_mul, host_axpy, host_mean, host_fresh,
};

struct Instr {
  Step step;
  int i, j, k;
  bool ta, tb;
  std::uint64_t seed;
};

inline std::vector<Instr> make_program(std::size_t count, std::uint64_t seed, int slots) {
  struct Weighted {
    Step step;
    int weight;
  };
  static constexpr Weighted table[] = {
      {Step::dev_avg, 10},       {Step::dev_mul, 5},         {Step::dev_axpy, 10},     {Step::dev_sgd, 8},
      {Step::dev_matmul, 8},     {Step::dev_sub_relu, 5},    {Step::dev_mean, 3},      {Step::dev_copy, 3},
      {Step::dev_fresh, 4},      {Step::to_host, 8},         {Step::to_dev, 8},        {Step::copy_into_dev, 5},
      {Step::copy_into_host, 5}, {Step::pinned_round_trip, 3}, {Step::host_avg, 6},    {Step::host_mul, 3},
      {Step::host_axpy, 5},      {Step::host_mean, 1},       {Step::host_fresh, 3},
  };
  int total = 0;
  for (const Weighted& w : table) total += w.weight;
  Rng rng(seed);
  std::vector<Instr> program;
  program.reserve(count);
  for (std::size_t n = 0; n < count; ++n) {
    std::int64_t pick = rng.below(total);
    Step step = table[0].step;
    for (const Weighted& w : table) {
      if (pick < w.weight) {
        step = w.step;
        break;
      }
      pick -= w.weight;
    }
    Instr in{step, static_cast<int>(rng.below(slots)), static_cast<int>(rng.below(slots)),
             static_cast<int>(rng.below(slots)), rng.coin(), rng.coin(), rng.next()};
    // In-place ops read one slot and write another: the kernels need not
    // support their operands aliasing.
    if (in.j == in.i) in.j = (in.i + 1) % slots;
    program.push_back(in);
  }
  return program;
}

struct ProgramResult {
  std::vector<std::vector<float>> dev, host, means;
};

struct ProgramOptions {
  std::int64_t side = 32;  // every tensor is [side, side]
  int slots = 16;          // per side: `slots` device and `slots` host tensors
  // GPU runs only: every `noise_every` steps a large independent matmul on the
  // device makes whichever compute stream takes it fall behind the others, so
  // consumers on other streams really depend on the cross-stream waits.
  int noise_every = 0;
  std::int64_t noise_side = 2048;
};

// Device slot s lives on devs[s % devs.size()]; an op whose operands live on
// other devices copies them over first (peer copies between GPUs, on their
// copy streams), so several devices exchange data all the time.
inline ProgramResult run_program(Engine& e, const std::vector<Instr>& program, const std::vector<Device>& devs,
                                 Device host, const ProgramOptions& opt) {
  namespace ops = weft::ops;
  const Shape shape{opt.side, opt.side};
  const auto n = static_cast<std::size_t>(opt.side * opt.side);
  std::vector<Tensor> D(static_cast<std::size_t>(opt.slots)), H(static_cast<std::size_t>(opt.slots));
  auto dev_of = [&](int slot) { return devs[static_cast<std::size_t>(slot) % devs.size()]; };
  // `t` on slot i's device (itself when it is there already).
  auto on = [&](int slot, const Tensor& t) { return t.device() == dev_of(slot) ? t : t.copy_to(dev_of(slot)); };
  for (int s = 0; s < opt.slots; ++s) {
    D[static_cast<std::size_t>(s)] =
        Tensor::uniform(e, shape, -1.0f, 1.0f, 1000 + static_cast<std::uint64_t>(s), dev_of(s));
    H[static_cast<std::size_t>(s)] = Tensor::from_host(e, shape, random_values(n, 2000 + static_cast<std::uint64_t>(s)), host);
  }
  std::vector<Tensor> means;
  std::vector<Tensor> noise_a, noise_b, noise_out(devs.size());
  if (opt.noise_every > 0) {
    for (Device d : devs) {
      noise_a.push_back(Tensor::uniform(e, Shape{opt.noise_side, opt.noise_side}, -1.0f, 1.0f, 11, d));
      noise_b.push_back(Tensor::uniform(e, Shape{opt.noise_side, opt.noise_side}, -1.0f, 1.0f, 12, d));
    }
  }
  const float inv_side = 1.0f / static_cast<float>(opt.side);
  std::size_t count = 0;
  for (const Instr& in : program) {
    Tensor& Di = D[static_cast<std::size_t>(in.i)];
    const Tensor Dj = on(in.i, D[static_cast<std::size_t>(in.j)]);
    const Tensor Dk = on(in.i, D[static_cast<std::size_t>(in.k)]);
    Tensor& Hi = H[static_cast<std::size_t>(in.i)];
    const Tensor& Hj = H[static_cast<std::size_t>(in.j)];
    const Tensor& Hk = H[static_cast<std::size_t>(in.k)];
    const Device dev = dev_of(in.i);
    switch (in.step) {
      case Step::dev_avg: Di = ops::mul_scalar(ops::add(Dj, Dk), 0.5f); break;
      case Step::dev_mul: Di = ops::mul(Dj, Dk); break;
      case Step::dev_axpy:
        ops::axpy(0.5f, Dj, Di);  // in place
        Di = ops::mul_scalar(Di, 2.0f / 3.0f);
        break;
      case Step::dev_sgd: ops::sgd_update(Di, Dj, 0.5f, 1.0f); break;  // w = w/2 - g/2, in place
      case Step::dev_matmul: Di = ops::mul_scalar(ops::matmul(Dj, Dk, in.ta, in.tb), inv_side); break;
      case Step::dev_sub_relu: Di = ops::mul_scalar(ops::sub(Dj, ops::relu(Dk)), 0.5f); break;
      case Step::dev_mean: means.push_back(ops::mean(D[static_cast<std::size_t>(in.j)])); break;
      case Step::dev_copy: Di = D[static_cast<std::size_t>(in.j)].copy_to(dev); break;
      case Step::dev_fresh: Di = Tensor::uniform(e, shape, -1.0f, 1.0f, in.seed, dev); break;
      case Step::to_host: Hi = D[static_cast<std::size_t>(in.j)].copy_to(host); break;
      case Step::to_dev: Di = Hj.copy_to(dev); break;
      case Step::copy_into_dev: Di.copy_from(Hj); break;
      case Step::copy_into_host: Hi.copy_from(D[static_cast<std::size_t>(in.j)]); break;
      case Step::pinned_round_trip: Di = Dj.copy_to(Device::cpu_pinned(0)).copy_to(dev); break;
      case Step::host_avg: Hi = ops::mul_scalar(ops::add(Hj, Hk), 0.5f); break;
      case Step::host_mul: Hi = ops::mul(Hj, Hk); break;
      case Step::host_axpy:
        ops::axpy(0.5f, Hj, Hi);
        Hi = ops::mul_scalar(Hi, 2.0f / 3.0f);
        break;
      case Step::host_mean: means.push_back(ops::mean(Hj)); break;
      case Step::host_fresh: Hi = Tensor::from_host(e, shape, random_values(n, in.seed), host); break;
    }
    if (opt.noise_every > 0 && ++count % static_cast<std::size_t>(opt.noise_every) == 0) {
      const std::size_t d = (count / static_cast<std::size_t>(opt.noise_every)) % devs.size();
      noise_out[d] = ops::matmul(noise_a[d], noise_b[d]);
    }
  }
  ProgramResult r;
  for (int s = 0; s < opt.slots; ++s) {
    const Tensor& t = D[static_cast<std::size_t>(s)];
    CHECK(t.device() == dev_of(s));
    r.dev.push_back(t.to_host());
  }
  for (const Tensor& t : H) {
    CHECK(t.device() == host);
    r.host.push_back(t.to_host());
  }
  for (const Tensor& t : means) r.means.push_back(t.to_host());
  e.wait_all();
  return r;
}

inline ProgramResult run_program(Engine& e, const std::vector<Instr>& program, Device dev, Device host,
                                 const ProgramOptions& opt) {
  return run_program(e, program, std::vector<Device>{dev}, host, opt);
}

// Compares two runs of one program; returns the number of elements whose bits differ.
inline std::size_t compare_runs(const ProgramResult& got, const ProgramResult& want, double rtol, double atol,
                                const std::string& what) {
  REQUIRE(got.dev.size() == want.dev.size());
  REQUIRE(got.host.size() == want.host.size());
  REQUIRE(got.means.size() == want.means.size());
  std::size_t bits = 0;
  double magnitude = 0;
  for (std::size_t s = 0; s < got.dev.size(); ++s) {
    expect_close(got.dev[s], want.dev[s], rtol, atol, what + ": device slot " + std::to_string(s));
    bits += count_bit_differences(got.dev[s], want.dev[s]);
    magnitude += mean_abs(want.dev[s]);
  }
  for (std::size_t s = 0; s < got.host.size(); ++s) {
    expect_close(got.host[s], want.host[s], rtol, atol, what + ": host slot " + std::to_string(s));
    bits += count_bit_differences(got.host[s], want.host[s]);
    magnitude += mean_abs(want.host[s]);
  }
  for (std::size_t s = 0; s < got.means.size(); ++s) {
    expect_close(got.means[s], want.means[s], rtol, atol, what + ": mean #" + std::to_string(s));
    bits += count_bit_differences(got.means[s], want.means[s]);
  }
  magnitude /= static_cast<double>(std::max<std::size_t>(1, got.dev.size() + got.host.size()));
  MESSAGE(what << ": mean |value| " << magnitude << " (the comparison is meaningful only if this is not ~0); "
               << bits << " elements differ in their bits; " << got.means.size() << " means");
  CHECK(magnitude > 1e-3);
  return bits;
}

}  // namespace gputest
