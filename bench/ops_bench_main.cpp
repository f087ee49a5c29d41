// weft-bench-ops: what running a kernel as an engine op costs, against calling
// the same kernel (or the library) directly, in the same process, interleaved.
//
//   small ops  : per-op dispatch cost (push, dependency tracking, output
//                allocation from the caching allocator, completion) for tiny
//                elementwise ops: engine_ns - direct_ns is the overhead;
//   matmul N^2 : N^2 x N^2 products pushed one after another to an engine
//                with one CPU worker (each op has the whole intra-op arena:
//                OpenBLAS split over oneTBB) against cblas_sgemm called
//                directly with OpenBLAS's own threads; ratio = direct_ns /
//                engine_ns (target >= 0.97 from 1024^2 up).
// GPU cases run when a GPU answers: kernel-launch cost through the engine vs
// launching on a stream directly, and cuBLAS GEMM through the engine vs direct
// in strict float32 (matmul_N), TF32 (matmul_tf32_N: ops::AllowTf32 against
// cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32) and bfloat16
// (matmul_bf16_N: bfloat16 tensors against cublasGemmEx on bfloat16 data with
// float32 accumulation); target ratio >= 0.95 at 4096^2.
//
// bw_<kernel>_<dtype> (GPU): bytes moved per second by the bfloat16 and
// float16 elementwise (add, mul_scalar, relu_grad), cast (from and to
// float32) and reduction (sum) kernels called directly, against a
// device-to-device copy (cudaMemcpyAsync) of the same element count measured
// in the same call, interleaved; bytes = what the kernel must read and write
// (a copy: twice its size); ratio = kernel_gbps / copy_gbps (target >= 0.8).
//
// adamw_step_<model>: one AdamW step (weft::optim) over a model's parameter
// list (LeNet: 8 tensors; ResNet-18: 62) as one foreach op per device against
// one op per parameter, same kernels, interleaved; ratio = per-parameter /
// foreach time (above 1: the multi-tensor op is cheaper).
//
// attention_<pass>_<dtype>_<B>x<H>x<T>x<D>: ops::causal_attention (pass fwd)
// and it with its backward (fwd_bwd) through the engine, as FLOP/s with the
// causal count (forward 2 * 2 * B*H*T*T*D / 2; backward 2.5 times that, as
// FlashAttention-2 counts), against a peer in the same run, interleaved: the
// dense batched GEMM of the scores' shape ([B*H] products of T x D by D x T,
// 2 * B*H*T*T*D FLOP) called directly (cuBLAS strided batched in the same
// dtype on a GPU; OpenBLAS float32 sgemm per plane on the CPU); ratio =
// attention FLOP/s / GEMM FLOP/s. On CPU devices the CPU kernel at small
// shapes; on a CUDA GPU the default path (WEFT_ATTENTION_IMPL as set) at
// [8,12,1024,64] and [4,16,2048,64], and for bfloat16 / float16 both CUDA
// paths side by side in the same run, interleaved (WEFT_ATTENTION_IMPL=gemm
// against =fused, cuDNN's fused graph): "path" says which path the default
// ran (fused, gemm; cpu on CPU devices), fused_ms and gemm_path_ms their
// times, gemm_over_fused = the GEMM path's FLOP/s / the fused path's and
// default_over_fused = the default path's FLOP/s / the fused path's (1 by
// construction when the fused path is the default's); "fused" says why
// not when cuDNN refused the fused graph (then no path fields).
//
// Output: a table, or with --json one line per case:
//   {"case":..., "engine_ns":..., "direct_ns":..., "ratio":..., ...}
//   {"case":"adamw_step_resnet18", "tensors":..., "foreach_us":..., "per_parameter_us":..., "ratio":..., ...}
//   {"case":"bw_add_bf16", "elements":..., "kernel_gbps":..., "copy_gbps":..., "ratio":..., ...}
//   {"case":"attention_fwd_bf16_8x12x1024x64", "tflops":..., "gemm_tflops":..., "ratio":..., ...}
#include <cblas.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "arg_cursor.h"
#include "cpu/cpu_kernels.h"
#include "cpu/intra_op.h"
#include "gpt_step_bench.h"
#include "measure.h"
#include "weft/error.h"
#include "weft/gpu.h"
#include "weft/gpu_streams.h"
#include "weft/nn.h"
#include "weft/ops.h"
#include "weft/optim.h"
#include "weft/tensor.h"

#if WEFT_HAVE_CUDA
#include "gpu/gpu_kernels.h"
#endif

extern "C" void openblas_set_num_threads(int);

namespace {

using weft_bench::Stopwatch;
using weft_bench::summarize;

struct Options {
  bool json = false;
  bool quick = false;
  bool bandwidth_only = false;  // --bandwidth: the bw_* cases alone
  bool attention_only = false;  // --attention: the attention_* cases alone
  int reps = 5;
};

struct Row {
  std::string name, device;
  std::int64_t ops = 0;
  weft_bench::Summary engine, direct;
};

// Runs engine and direct alternately (A B A B ...) and keeps per-op medians.
// `settle`, when given, runs untimed after each direct run.
Row measure(std::string name, std::string device, std::int64_t ops, int reps, const std::function<void()>& engine_run,
            const std::function<void()>& direct_run, const std::function<void()>& settle = {}) {
  engine_run();  // warm-up: caches, allocator, library handles
  direct_run();
  if (settle) settle();
  std::vector<double> e, d;
  for (int r = 0; r < reps; ++r) {
    Stopwatch a;
    engine_run();
    e.push_back(a.seconds() * 1e9 / static_cast<double>(ops));
    Stopwatch b;
    direct_run();
    d.push_back(b.seconds() * 1e9 / static_cast<double>(ops));
    if (settle) settle();
  }
  return Row{std::move(name), std::move(device), ops, summarize(e), summarize(d)};
}

void print(const Options& o, const std::vector<Row>& rows) {
  if (!o.json && !rows.empty()) {
    std::printf("%-16s %-8s %10s %12s %12s %8s\n", "case", "device", "ops", "engine_ns", "direct_ns", "ratio");
  }
  for (const Row& r : rows) {
    const double ratio = r.direct.median / r.engine.median;
    if (o.json)
      std::printf(
          "{\"case\":\"%s\",\"device\":\"%s\",\"ops\":%lld,\"engine_ns\":%.1f,\"direct_ns\":%.1f,\"ratio\":%.4f,"
          "\"engine_ns_min\":%.1f,\"engine_ns_max\":%.1f,\"direct_ns_min\":%.1f,\"direct_ns_max\":%.1f,\"reps\":%d}\n",
          r.name.c_str(), r.device.c_str(), static_cast<long long>(r.ops), r.engine.median, r.direct.median, ratio,
          r.engine.min, r.engine.max, r.direct.min, r.direct.max, o.reps);
    else
      std::printf("%-16s %-8s %10lld %12.1f %12.1f %8.3f\n", r.name.c_str(), r.device.c_str(),
                  static_cast<long long>(r.ops), r.engine.median, r.direct.median, ratio);
  }
}

// One optimizer step's time as one foreach op against one op per parameter.
struct OptimizerRow {
  std::string name, device;
  std::size_t tensors = 0;
  std::int64_t elements = 0, steps = 0;
  weft_bench::Summary foreach, per_parameter;
};

void optimizer_cases(const Options& o, weft::Engine& engine, weft::Device device, std::vector<OptimizerRow>& rows) {
  namespace nn = weft::nn;
  namespace optim = weft::optim;
  struct Model {
    const char* name;
    std::unique_ptr<nn::Sequential> net;
    std::int64_t steps;
  };
  std::vector<Model> models;
  models.push_back({"lenet", nn::lenet(engine, device, 1), o.quick ? 10 : 200});
  if (!o.quick) models.push_back({"resnet18", nn::resnet18(engine, device, 1), 10});
  for (Model& m : models) {
    std::vector<nn::Parameter*> params = m.net->parameters();
    std::int64_t elements = 0;
    for (std::size_t k = 0; k < params.size(); ++k) {
      nn::Parameter& p = *params[k];
      p.grad = weft::Tensor::uniform(engine, p.value.shape(), -1, 1, 100 + k, device);
      elements += p.value.numel();
    }
    optim::OptimizerOptions each = optim::OptimizerOptions::adamw(1e-3f), single = each;
    single.foreach = false;
    // Two optimizers over the same parameters: each keeps its own state.
    optim::Optimizer foreach_opt(params, each), per_parameter_opt(params, single);
    const Row r = measure(
        "", "", m.steps, o.reps,
        [&] {
          for (std::int64_t i = 0; i < m.steps; ++i) foreach_opt.step();
          engine.wait_all();
        },
        [&] {
          for (std::int64_t i = 0; i < m.steps; ++i) per_parameter_opt.step();
          engine.wait_all();
        });
    rows.push_back(OptimizerRow{std::string("adamw_step_") + m.name, device.str(), params.size(), elements, m.steps,
                                r.engine, r.direct});
  }
}

void print_optimizer(const Options& o, const std::vector<OptimizerRow>& rows) {
  if (!o.json && !rows.empty())
    std::printf("%-20s %-8s %8s %10s %14s %18s %8s\n", "case", "device", "tensors", "elements", "foreach_us",
                "per_parameter_us", "ratio");
  for (const OptimizerRow& r : rows) {
    // Per step, in microseconds (the summaries are per step in ns).
    const double f = r.foreach.median / 1e3, p = r.per_parameter.median / 1e3;
    if (o.json)
      std::printf(
          "{\"case\":\"%s\",\"device\":\"%s\",\"tensors\":%zu,\"elements\":%lld,\"steps\":%lld,"
          "\"foreach_us\":%.1f,\"per_parameter_us\":%.1f,\"ratio\":%.4f,\"foreach_us_min\":%.1f,"
          "\"foreach_us_max\":%.1f,\"per_parameter_us_min\":%.1f,\"per_parameter_us_max\":%.1f,\"reps\":%d}\n",
          r.name.c_str(), r.device.c_str(), r.tensors, static_cast<long long>(r.elements),
          static_cast<long long>(r.steps), f, p, p / f, r.foreach.min / 1e3, r.foreach.max / 1e3,
          r.per_parameter.min / 1e3, r.per_parameter.max / 1e3, o.reps);
    else
      std::printf("%-20s %-8s %8zu %10lld %14.1f %18.1f %8.3f\n", r.name.c_str(), r.device.c_str(), r.tensors,
                  static_cast<long long>(r.elements), f, p, p / f);
  }
}

void cpu_cases(const Options& o, weft::Engine& engine, weft::Engine& serial, std::vector<Row>& rows) {
  const weft::Device cpu = weft::Device::cpu(0);
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{65536}}) {
    const std::int64_t ops = o.quick ? 200 : (n == 1 ? 20000 : 2000);
    auto x = weft::Tensor::ones(engine, {n}, cpu);
    std::vector<float> a(static_cast<std::size_t>(n), 1.0f), y(static_cast<std::size_t>(n));
    rows.push_back(measure(
        "add_" + std::to_string(n), "cpu", ops, o.reps,
        [&] {
          for (std::int64_t i = 0; i < ops; ++i) weft::ops::add(x, x);
          engine.wait_all();
        },
        [&] {
          for (std::int64_t i = 0; i < ops; ++i) weft::kernels::cpu::add(y.data(), a.data(), a.data(), n);
        }));
  }
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  for (std::int64_t n : {256, 512, 1024, 2048}) {
    if (o.quick && n > 256) break;
    const std::int64_t ops = n <= 512 ? 16 : (n == 1024 ? 8 : 4);
    // One op at a time, like the direct calls: each GEMM gets the whole
    // intra-op arena, as a single library call gets all of OpenBLAS's threads.
    auto a = weft::Tensor::uniform(serial, {n, n}, -1, 1, 1, cpu);
    auto b = weft::Tensor::uniform(serial, {n, n}, -1, 1, 2, cpu);
    std::vector<float> ha = a.to_host(), hb = b.to_host(), hc(static_cast<std::size_t>(n * n));
    const int fn = static_cast<int>(n);
    rows.push_back(measure(
        "matmul_" + std::to_string(n), "cpu", ops, o.reps,
        [&] {
          openblas_set_num_threads(1);  // the engine's kernels split GEMMs themselves
          for (std::int64_t i = 0; i < ops; ++i) weft::ops::matmul(a, b);
          serial.wait_all();
        },
        [&] {
          openblas_set_num_threads(threads);  // the library on its own, with its threads
          for (std::int64_t i = 0; i < ops; ++i)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, fn, fn, fn, 1.0f, ha.data(), fn, hb.data(), fn,
                        0.0f, hc.data(), fn);
        },
        [&] {
          // OpenBLAS's idle threads spin for a while (2^28 cycles by default)
          // before they sleep: let them, or they steal a core from the next
          // engine run.
          openblas_set_num_threads(1);
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }));
  }
}

// Causal attention's FLOP rate (engine) against the dense batched GEMM of
// its scores' shape (direct), both per call.
struct AttentionRow {
  std::string name, device;
  double flops = 0, gemm_flops = 0;
  weft_bench::Summary attention, gemm;  // ns per call
  std::string path = "cpu";             // the path the default ran
  bool paths = false;                   // gemm_path and fused were measured
  weft_bench::Summary gemm_path, fused;  // ns per call, WEFT_ATTENTION_IMPL=gemm / =fused
  std::string fused_refusal;            // why the fused path did not run (CUDA halves)
};

// Sets WEFT_ATTENTION_IMPL for a scope (the engine must be idle: its
// workers read the variable when an attention op runs) and puts the
// caller's value back.
class AttentionImplScope {
 public:
  explicit AttentionImplScope(const char* impl) {
    if (const char* old = std::getenv("WEFT_ATTENTION_IMPL")) old_ = std::string(old);
    ::setenv("WEFT_ATTENTION_IMPL", impl, 1);
  }
  ~AttentionImplScope() {
    if (old_)
      ::setenv("WEFT_ATTENTION_IMPL", old_->c_str(), 1);
    else
      ::unsetenv("WEFT_ATTENTION_IMPL");
  }
  AttentionImplScope(const AttentionImplScope&) = delete;
  AttentionImplScope& operator=(const AttentionImplScope&) = delete;

 private:
  std::optional<std::string> old_;
};

const char* short_dtype(weft::DType t) {
  return t == weft::DType::bfloat16 ? "bf16" : t == weft::DType::float16 ? "fp16" : "fp32";
}

// One row per (shape, dtype, pass) on `device`; `gemm_peer(planes, t, d)`
// runs the peer once (and synchronizes).
void attention_cases(const Options& o, weft::Engine& engine, weft::Device device,
                     const std::vector<weft::Shape>& shapes, const std::vector<weft::DType>& dtypes, std::int64_t calls,
                     const std::function<void(weft::DType, std::int64_t, std::int64_t, std::int64_t)>& gemm_peer,
                     const std::function<void()>& settle, std::vector<AttentionRow>& rows,
                     bool compare_cuda_paths = false) {
  namespace ops = weft::ops;
  for (const weft::Shape& s : shapes) {
    const std::int64_t planes = s[0] * s[1], t = s[2], d = s[3];
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const double fwd = 2.0 * 2.0 * static_cast<double>(planes) * static_cast<double>(t) * static_cast<double>(t) *
                       static_cast<double>(d) / 2.0;
    const double gemm = 2.0 * static_cast<double>(planes) * static_cast<double>(t) * static_cast<double>(t) *
                        static_cast<double>(d);
    for (weft::DType dt : dtypes) {
      weft::Tensor in[4];
      for (int x = 0; x < 4; ++x) {
        in[x] = weft::Tensor::uniform(engine, s, -1, 1, 10 + static_cast<std::uint64_t>(x), device);
        if (dt != weft::DType::float32) in[x] = ops::cast(in[x], dt);
      }
      engine.wait_all();
      for (bool backward : {false, true}) {
        const auto run = [&] {
          for (std::int64_t i = 0; i < calls; ++i) {
            ops::CausalAttention a = ops::causal_attention(in[0], in[1], in[2], scale);
            if (backward) ops::causal_attention_backward(in[0], in[1], in[2], a.out, in[3], a.lse, scale);
          }
          engine.wait_all();
        };
        AttentionRow row;
        if (compare_cuda_paths) {
          row.path = "gemm";
          if (dt != weft::DType::float32) {
            try {
              const AttentionImplScope fused("fused");
              run();  // builds the plans; cuDNN's refusal is a weft::Error here
              row.path = "fused";
            } catch (const weft::Error& e) {
              row.fused_refusal = e.what();
            }
          }
          if (row.path == "fused") {
            const Row p = measure(
                "", "", calls, o.reps,
                [&] {
                  const AttentionImplScope gemm("gemm");
                  run();
                },
                [&] {
                  const AttentionImplScope fused("fused");
                  run();
                },
                settle);
            row.paths = true;
            row.gemm_path = p.engine;
            row.fused = p.direct;
          }
          // What the default picked: fused where it runs, unless the caller forced gemm.
          if (const char* v = std::getenv("WEFT_ATTENTION_IMPL"); v && std::string(v) == "gemm") row.path = "gemm";
        }
        const Row r = measure(
            "", "", calls, o.reps, run,
            [&] {
              for (std::int64_t i = 0; i < calls; ++i) gemm_peer(dt, planes, t, d);
            },
            settle);
        std::string name = std::string("attention_") + (backward ? "fwd_bwd_" : "fwd_") + short_dtype(dt) + "_" +
                           std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(t) + "x" +
                           std::to_string(d);
        row.name = std::move(name);
        row.device = device.str();
        row.flops = backward ? 3.5 * fwd : fwd;
        row.gemm_flops = gemm;
        row.attention = r.engine;
        row.gemm = r.direct;
        rows.push_back(std::move(row));
      }
    }
  }
}

void cpu_attention_cases(const Options& o, weft::Engine& engine, std::vector<AttentionRow>& rows) {
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  std::vector<float> a, b, c;
  const std::vector<weft::Shape> shapes =
      o.quick ? std::vector<weft::Shape>{{1, 2, 128, 64}} : std::vector<weft::Shape>{{2, 4, 256, 64}, {1, 4, 1024, 64}};
  attention_cases(
      o, engine, weft::Device::cpu(0), shapes, {weft::DType::float32, weft::DType::bfloat16, weft::DType::float16},
      o.quick ? 1 : 2,
      [&](weft::DType, std::int64_t planes, std::int64_t t, std::int64_t d) {
        // float32 whatever the dtype (the CPU kernel computes halves in float32 too).
        const auto n = static_cast<std::size_t>(planes * t * d);
        if (a.size() != n) {
          a.assign(n, 0.5f);
          b.assign(n, 0.25f);
          c.assign(static_cast<std::size_t>(planes * t * t), 0.0f);
        }
        openblas_set_num_threads(threads);
        const int ft = static_cast<int>(t), fd = static_cast<int>(d);
        for (std::int64_t p = 0; p < planes; ++p)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ft, ft, fd, 1.0f, a.data() + p * t * d, fd,
                      b.data() + p * t * d, fd, 0.0f, c.data() + p * t * t, ft);
      },
      [] {
        // OpenBLAS's spinning threads would steal the cores of the next engine run (as for matmul_N).
        openblas_set_num_threads(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      },
      rows);
}

void print_attention(const Options& o, const std::vector<AttentionRow>& rows) {
  if (!o.json && !rows.empty())
    std::printf("%-36s %-8s %12s %12s %12s %8s  %s\n", "case", "device", "ms", "tflops", "gemm_tflops", "ratio",
                "path");
  for (const AttentionRow& r : rows) {
    const double tf = r.flops / r.attention.median / 1e3, gtf = r.gemm_flops / r.gemm.median / 1e3;  // ns -> TFLOP/s
    std::string paths;  // the JSON fields of the two CUDA paths
    if (r.paths) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    ",\"fused_ms\":%.4f,\"gemm_path_ms\":%.4f,\"gemm_over_fused\":%.4f,\"default_over_fused\":%.4f",
                    r.fused.median / 1e6, r.gemm_path.median / 1e6, r.fused.median / r.gemm_path.median,
                    r.fused.median / r.attention.median);
      paths = buf;
    } else if (!r.fused_refusal.empty()) {
      std::string text;
      for (char c : r.fused_refusal) {
        if (c == '"' || c == '\\') text.push_back('\\');
        text.push_back(c == '\n' ? ' ' : c);
      }
      paths = ",\"fused\":\"" + text + "\"";
    }
    if (o.json)
      std::printf(
          "{\"case\":\"%s\",\"device\":\"%s\",\"path\":\"%s\",\"flops\":%.4g,\"ms\":%.4f,\"tflops\":%.4f,"
          "\"gemm_flops\":%.4g,\"gemm_ms\":%.4f,\"gemm_tflops\":%.4f,\"ratio\":%.4f,\"ms_min\":%.4f,\"ms_max\":%.4f%s,"
          "\"reps\":%d}\n",
          r.name.c_str(), r.device.c_str(), r.path.c_str(), r.flops, r.attention.median / 1e6, tf, r.gemm_flops,
          r.gemm.median / 1e6, gtf, tf / gtf, r.attention.min / 1e6, r.attention.max / 1e6, paths.c_str(), o.reps);
    else if (r.paths)
      std::printf("%-36s %-8s %12.3f %12.4f %12.4f %8.3f  %s; gemm/fused %.3f\n", r.name.c_str(), r.device.c_str(),
                  r.attention.median / 1e6, tf, gtf, tf / gtf, r.path.c_str(), r.fused.median / r.gemm_path.median);
    else
      std::printf("%-36s %-8s %12.3f %12.4f %12.4f %8.3f  %s\n", r.name.c_str(), r.device.c_str(),
                  r.attention.median / 1e6, tf, gtf, tf / gtf, r.path.c_str());
  }
}

// A kernel's bandwidth against a device-to-device copy of the same elements.
struct BandwidthRow {
  std::string name;
  std::int64_t elements = 0;
  double kernel_bytes = 0, copy_bytes = 0;  // per call
  weft_bench::Summary kernel_s, copy_s;     // seconds per call
};

void print_bandwidth(const Options& o, const std::vector<BandwidthRow>& rows) {
  if (!o.json && !rows.empty())
    std::printf("%-22s %10s %12s %12s %10s %10s %8s\n", "case", "elements", "kernel_MB", "copy_MB", "kernel_GBps",
                "copy_GBps", "ratio");
  for (const BandwidthRow& r : rows) {
    const double k = r.kernel_bytes / r.kernel_s.median / 1e9, c = r.copy_bytes / r.copy_s.median / 1e9;
    if (o.json)
      std::printf(
          "{\"case\":\"%s\",\"device\":\"gpu\",\"elements\":%lld,\"kernel_bytes\":%.0f,\"copy_bytes\":%.0f,"
          "\"kernel_us\":%.2f,\"copy_us\":%.2f,\"kernel_gbps\":%.1f,\"copy_gbps\":%.1f,\"ratio\":%.4f,"
          "\"kernel_gbps_max\":%.1f,\"copy_gbps_max\":%.1f,\"reps\":%d}\n",
          r.name.c_str(), static_cast<long long>(r.elements), r.kernel_bytes, r.copy_bytes, r.kernel_s.median * 1e6,
          r.copy_s.median * 1e6, k, c, k / c, r.kernel_bytes / r.kernel_s.min / 1e9, r.copy_bytes / r.copy_s.min / 1e9,
          o.reps);
    else
      std::printf("%-22s %10lld %12.1f %12.1f %10.1f %10.1f %8.3f\n", r.name.c_str(),
                  static_cast<long long>(r.elements), r.kernel_bytes / 1e6, r.copy_bytes / 1e6, k, c, k / c);
  }
}

#if WEFT_HAVE_CUDA
// The half kernels' bandwidth (bw_*): each kernel and the copy run `calls`
// times back to back per timing, then the stream is synchronized; kernel and
// copy alternate, and the medians per call are kept.
void bandwidth_cases(const Options& o, weft::gpu::StreamResources& direct, weft::Allocator& alloc,
                     std::vector<BandwidthRow>& rows) {
  namespace k = weft::kernels::gpu;
  using weft::DType;
  const auto& h = direct.handles();
  const std::int64_t n = o.quick ? (std::int64_t{1} << 22) : (std::int64_t{1} << 26);
  const int calls = o.quick ? 3 : 20;
  const std::size_t n_bytes = static_cast<std::size_t>(n);
  // Half inputs a and b (made from float32 values in src32), outputs in y
  // (float32-sized, for the casts to float32), the copy's own destination.
  weft::Block src32 = alloc.allocate(n_bytes * 4, h.stream), a = alloc.allocate(n_bytes * 2, h.stream),
              b = alloc.allocate(n_bytes * 2, h.stream), y = alloc.allocate(n_bytes * 4, h.stream),
              copy_dst = alloc.allocate(n_bytes * 2, h.stream), out = alloc.allocate(16, h.stream);
  k::uniform(h, static_cast<float*>(src32.ptr), n, -1, 1, 1);
  struct Half {
    const char* suffix;
    DType t;
  };
  for (const Half& half : {Half{"bf16", DType::bfloat16}, Half{"fp16", DType::float16}}) {
    const DType t = half.t;
    const double e = static_cast<double>(weft::dtype_size(t)), f = 4.0, count = static_cast<double>(n);
    k::cast(h, a.ptr, t, src32.ptr, DType::float32, n);
    k::cast(h, b.ptr, t, src32.ptr, DType::float32, n);
    k::mul_scalar(h, t, b.ptr, b.ptr, -0.5f, n);
    direct.synchronize();
    struct Case {
      std::string name;
      double bytes;
      std::function<void()> run;
    };
    const std::vector<Case> cases{
        {"bw_add_", 3 * e * count, [&] { k::add(h, t, y.ptr, a.ptr, b.ptr, n); }},
        {"bw_mul_scalar_", 2 * e * count, [&] { k::mul_scalar(h, t, y.ptr, a.ptr, 0.5f, n); }},
        {"bw_relu_grad_", 3 * e * count, [&] { k::relu_grad(h, t, y.ptr, a.ptr, b.ptr, n); }},
        {"bw_cast_from_f32_", (f + e) * count, [&] { k::cast(h, y.ptr, t, src32.ptr, DType::float32, n); }},
        {"bw_cast_to_f32_", (f + e) * count, [&] { k::cast(h, y.ptr, DType::float32, a.ptr, t, n); }},
        {"bw_sum_", e * count, [&] { k::sum(h, t, out.ptr, a.ptr, n); }},
    };
    for (const Case& c : cases) {
      // The copy moves the half tensor's bytes: read once, written once.
      const auto copy = [&] { k::cast(h, copy_dst.ptr, t, a.ptr, t, n); };
      const auto time = [&](const std::function<void()>& fn) {
        Stopwatch w;
        for (int i = 0; i < calls; ++i) fn();
        direct.synchronize();
        return w.seconds() / calls;
      };
      c.run();  // warm-up
      copy();
      direct.synchronize();
      std::vector<double> ks, cs;
      for (int r = 0; r < o.reps; ++r) {
        ks.push_back(time(c.run));
        cs.push_back(time(copy));
      }
      rows.push_back(BandwidthRow{c.name + half.suffix, n, c.bytes, 2 * e * count, summarize(ks), summarize(cs)});
    }
  }
  for (weft::Block* blk : {&src32, &a, &b, &y, &copy_dst, &out}) alloc.free(*blk);
}

void gpu_cases(const Options& o, weft::Engine& engine, std::vector<Row>& rows) {
  const weft::Device gpu = weft::Device::gpu(0);
  weft::gpu::StreamResources direct(0, weft::gpu::StreamRole::compute, std::size_t{64} << 20);
  const auto& h = direct.handles();
  weft::Allocator& alloc = engine.allocator(gpu);
  {
    const std::int64_t ops = o.quick ? 200 : 20000;
    auto x = weft::Tensor::ones(engine, {1}, gpu);
    weft::Block a = alloc.allocate(4, h.stream), y = alloc.allocate(4, h.stream);
    rows.push_back(measure(
        "add_1", "gpu", ops, o.reps,
        [&] {
          for (std::int64_t i = 0; i < ops; ++i) weft::ops::add(x, x);
          engine.wait_all();
        },
        [&] {
          for (std::int64_t i = 0; i < ops; ++i)
            weft::kernels::gpu::add(h, weft::DType::float32, y.ptr, a.ptr, a.ptr, 1);
          direct.synchronize();
        }));
    alloc.free(a);
    alloc.free(y);
  }
  // Precision of a GEMM row: the tensors' dtype and whether float32 may run
  // on TF32 tensor cores.
  struct Precision {
    const char* prefix;
    weft::DType dtype;
    bool tf32;
  };
  for (const Precision& p : {Precision{"matmul_", weft::DType::float32, false},
                             Precision{"matmul_tf32_", weft::DType::float32, true},
                             Precision{"matmul_bf16_", weft::DType::bfloat16, false}}) {
    for (std::int64_t n : {1024, 4096, 8192}) {
      const std::int64_t ops = o.quick ? 2 : 10;
      const std::size_t bytes = static_cast<std::size_t>(n * n) * weft::dtype_size(p.dtype);
      auto a32 = weft::Tensor::uniform(engine, {n, n}, -1, 1, 1, gpu);
      auto b32 = weft::Tensor::uniform(engine, {n, n}, -1, 1, 2, gpu);
      auto a = p.dtype == weft::DType::float32 ? a32 : weft::ops::cast(a32, p.dtype);
      auto b = p.dtype == weft::DType::float32 ? b32 : weft::ops::cast(b32, p.dtype);
      engine.wait_all();
      // The direct run has its own copies of the same inputs on its own stream.
      const std::size_t floats = static_cast<std::size_t>(n * n) * 4;
      weft::Block c = alloc.allocate(bytes, h.stream);
      weft::Block fa = alloc.allocate(floats, h.stream), fb = alloc.allocate(floats, h.stream);
      weft::Block da = alloc.allocate(bytes, h.stream), db = alloc.allocate(bytes, h.stream);
      weft::kernels::gpu::uniform(h, static_cast<float*>(fa.ptr), n * n, -1, 1, 1);
      weft::kernels::gpu::uniform(h, static_cast<float*>(fb.ptr), n * n, -1, 1, 2);
      weft::kernels::gpu::cast(h, da.ptr, p.dtype, fa.ptr, weft::DType::float32, n * n);
      weft::kernels::gpu::cast(h, db.ptr, p.dtype, fb.ptr, weft::DType::float32, n * n);
      std::string name = p.prefix;
      name += std::to_string(n);
      rows.push_back(measure(
          std::move(name), "gpu", ops, o.reps,
          [&] {
            const weft::ops::AllowTf32 tf32(p.tf32);
            for (std::int64_t i = 0; i < ops; ++i) weft::ops::matmul(a, b);
            engine.wait_all();
          },
          [&] {
            for (std::int64_t i = 0; i < ops; ++i)
              weft::kernels::gpu::gemm(h, p.dtype, p.tf32, false, false, n, n, n, 1.0f, da.ptr, n, db.ptr, n, 0.0f,
                                       c.ptr, n);
            direct.synchronize();
          }));
      direct.synchronize();
      for (weft::Block* blk : {&c, &fa, &fb, &da, &db}) alloc.free(*blk);
    }
  }
}

// On a CUDA GPU: the batched-GEMM path against cuBLAS's strided-batched GEMM
// of the scores' shape in the same dtype on a stream of its own.
void gpu_attention_cases(const Options& o, weft::Engine& engine, std::vector<AttentionRow>& rows) {
  const weft::Device gpu = weft::Device::gpu(0);
  weft::gpu::StreamResources direct(0, weft::gpu::StreamRole::compute, std::size_t{64} << 20);
  const auto& h = direct.handles();
  weft::Allocator& alloc = engine.allocator(gpu);
  std::vector<weft::Block> held;
  std::size_t held_bytes = 0;
  const std::vector<weft::Shape> shapes =
      o.quick ? std::vector<weft::Shape>{{8, 12, 1024, 64}} : std::vector<weft::Shape>{{8, 12, 1024, 64}, {4, 16, 2048, 64}};
  attention_cases(
      o, engine, gpu, shapes, {weft::DType::bfloat16, weft::DType::float16, weft::DType::float32}, o.quick ? 2 : 10,
      [&](weft::DType dt, std::int64_t planes, std::int64_t t, std::int64_t d) {
        const std::size_t in_bytes = static_cast<std::size_t>(planes * t * d) * weft::dtype_size(dt);
        const std::size_t out_bytes = static_cast<std::size_t>(planes * t * t) * weft::dtype_size(dt);
        if (held_bytes != 2 * in_bytes + out_bytes) {  // a new shape or dtype: new operands (zeros)
          direct.synchronize();
          for (weft::Block& blk : held) alloc.free(blk);
          held = {alloc.allocate(in_bytes, h.stream), alloc.allocate(in_bytes, h.stream),
                  alloc.allocate(out_bytes, h.stream)};
          held_bytes = 2 * in_bytes + out_bytes;
          weft::kernels::gpu::fill(h, dt, held[0].ptr, planes * t * d, 0.5f);
          weft::kernels::gpu::fill(h, dt, held[1].ptr, planes * t * d, 0.25f);
        }
        weft::kernels::gpu::gemm_batched(h, dt, false, false, true, planes, t, t, d, 1.0f, held[0].ptr, d, t * d,
                                         held[1].ptr, d, t * d, 0.0f, held[2].ptr, t, t * t);
        direct.synchronize();
      },
      {}, rows, true);
  direct.synchronize();
  for (weft::Block& blk : held) alloc.free(blk);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Options o;
  weft_bench::GptStepOptions gpt;
  bool gpt_mode = false;
  for (weft::examples::ArgCursor args(argc, argv); args.next();) {
    const std::string& a = args.flag();
    if (a == "--json") o.json = true;
    else if (a == "--quick") o.quick = true, o.reps = 3;
    else if (a == "--gpt") gpt_mode = true;
    else if (a == "--gpt-no-profile") gpt.profile = false;
    else if (a == "--gpt-model") {
      const std::optional<std::string> v = args.value();
      if (!v) {
        std::fprintf(stderr, "weft-bench-ops: --gpt-model wants tiny, 6x384 or all (see --help)\n");
        return 2;
      }
      gpt.model = *v;
    } else if (a == "--gpt-batch") {
      const std::optional<std::string> v = args.value();
      const auto n = v ? weft::examples::ArgCursor::parse_int(*v, 1, 4096) : std::nullopt;
      if (!n) {
        std::fprintf(stderr, "weft-bench-ops: --gpt-batch wants a number from 1 to 4096 (see --help)\n");
        return 2;
      }
      gpt.batch = static_cast<int>(*n);
    }
    else if (a == "--bandwidth") o.bandwidth_only = true;
    else if (a == "--attention") o.attention_only = true;
    else if (a == "--reps") {
      const std::optional<std::string> v = args.value();
      const auto n = v ? weft::examples::ArgCursor::parse_int(*v, 1, 1000) : std::nullopt;
      if (!n) {
        std::fprintf(stderr, "weft-bench-ops: --reps wants a number from 1 to 1000 (see --help)\n");
        return 2;
      }
      o.reps = static_cast<int>(*n);
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "weft-bench-ops [--json] [--quick] [--reps N] [--bandwidth | --attention]\n"
          "  Per-op dispatch cost of small ops through the engine vs calling the kernel directly, and\n"
          "  matmul through the engine vs the BLAS library called directly (ratio = direct/engine).\n"
          "  GPU cases (kernel launch; cuBLAS GEMM in float32, TF32 and bfloat16) run when a GPU answers.\n"
          "  adamw_step_<model>: an AdamW step as one foreach op vs one op per parameter (ratio = per-parameter\n"
          "  / foreach).\n"
          "  bw_<kernel>_<bf16|fp16> (GPU): the half kernels' bytes per second against a device-to-device copy\n"
          "  measured in the same run (ratio = kernel / copy); --bandwidth runs these alone.\n"
          "  attention_<fwd|fwd_bwd>_<dtype>_<BxHxTxD>: causal attention's FLOP/s (causal count) against the\n"
          "  dense batched GEMM of its scores' shape called directly (ratio = attention / GEMM FLOP/s); CPU\n"
          "  kernel at small shapes, and on a CUDA GPU [8,12,1024,64] and [4,16,2048,64]; --attention runs\n"
          "  these alone.\n"
          "  --gpt [--gpt-model tiny|6x384|all] [--gpt-batch N] [--gpt-no-profile]: a GPT training step\n"
          "  (forward, lm_loss, backward, AdamW) on cpu(0): ms/step and tokens/s over --reps steps, then the\n"
          "  profiler's per-op time per step (bench/gpt_cpu_step.py runs it beside PyTorch).\n");
      return 0;
    } else {
      std::fprintf(stderr, "weft-bench-ops: unknown argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  try {
    if (gpt_mode) {
      gpt.reps = o.reps;
      gpt.json = o.json;
      return weft_bench::run_gpt_step_bench(gpt);
    }
    auto engine = weft::Engine::create(weft::EngineConfig{.kind = "threaded"});
    auto serial = weft::Engine::create(weft::EngineConfig{.kind = "threaded", .workers_per_cpu_device = 1});
    std::vector<Row> rows;
    if (o.bandwidth_only && o.attention_only) {
      std::fprintf(stderr, "weft-bench-ops: --bandwidth and --attention each run one family alone; give one\n");
      return 2;
    }
    const bool all = !o.bandwidth_only && !o.attention_only;
    if (all) cpu_cases(o, *engine, *serial, rows);
    std::vector<BandwidthRow> bandwidth_rows;
#if WEFT_HAVE_CUDA
    if (all && weft::gpu::device_count() > 0) gpu_cases(o, *engine, rows);
    if (!o.attention_only && weft::gpu::device_count() > 0 && !weft::gpu::properties(0).simulated) {
      weft::gpu::StreamResources direct(0, weft::gpu::StreamRole::compute, std::size_t{64} << 20);
      bandwidth_cases(o, direct, engine->allocator(weft::Device::gpu(0)), bandwidth_rows);
    }
#endif
    std::vector<AttentionRow> attention_rows;
    if (!o.bandwidth_only) {
      cpu_attention_cases(o, *serial, attention_rows);
#if WEFT_HAVE_CUDA
      if (weft::gpu::device_count() > 0 && !weft::gpu::properties(0).simulated)
        gpu_attention_cases(o, *engine, attention_rows);
#endif
    }
    std::vector<OptimizerRow> optimizer_rows;
    if (all) {
      optimizer_cases(o, *engine, weft::Device::cpu(0), optimizer_rows);
      if (weft::gpu::device_count() > 0 && !weft::gpu::properties(0).simulated)
        optimizer_cases(o, *engine, weft::Device::gpu(0), optimizer_rows);
    }
    if (!o.json)
      std::printf("weft-bench-ops: %u hardware threads, %d GPU(s); medians of %d, interleaved\n",
                  std::thread::hardware_concurrency(), weft::gpu::device_count(), o.reps);
    print(o, rows);
    print_optimizer(o, optimizer_rows);
    print_bandwidth(o, bandwidth_rows);
    print_attention(o, attention_rows);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-bench-ops: %s\n", e.what());
    return 1;
  }
  return 0;
}
