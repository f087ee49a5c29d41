// 2-D convolution through cuDNN 9's legacy API, in float32, bfloat16 or
// float16 data (ConvGeometry::dtype) with float32 accumulation.
//
// Layout: ConvGeometry::nhwc gives x, y NHWC descriptors and an NHWC (KRSC)
// filter descriptor, the layout of cuDNN's tensor-core kernels; the bias is
// then added and summed by own kernels over [N*OH*OW, O] rows.
//
// Algorithm choices live in one cache per device (algorithm_cache.h), shared
// by the device's workers, least recently used out first beyond
// WEFT_CUDNN_CACHE_SIZE entries, keyed by geometry, dtype, layout, math,
// direction, algorithm mode and workspace size: a geometry is benchmarked
// once per device, every worker runs the same algorithm, and a choice made
// while the stream is captured into a CUDA graph (where trial runs cannot
// run) is provisional, measured at the key's next uncaptured use.
// Descriptors are host objects whose math type each call sets, so each
// worker thread keeps its own, in a cache of the same bound.
//
// Math: strict float32 asks for CUDNN_FMA_MATH (no tensor cores), float32
// with tf32 for CUDNN_DEFAULT_MATH (TF32 tensor cores allowed), the halves
// for CUDNN_TENSOR_OP_MATH; each algorithm then runs with the math type cuDNN
// reported for it. Algorithm choice, per direction on its first use:
// heuristic walks cuDNN's *_v7 ranking (no trial runs, no synchronization);
// benchmark runs cudnnFind*AlgorithmEx on the op's own buffers, on the
// worker's stream with its workspace, and keeps the fastest (it synchronizes
// the stream, once per key and device); deterministic keeps only
// CUDNN_DETERMINISTIC algorithms with either. Strict float32 prefers FMA-only
// algorithms and runs another math type only when none fits. The first
// algorithm whose workspace fits the worker's wins; none fitting is a
// weft::Error naming the geometry. Each choice is written to the profiler's
// notes (weft::Profiler::note). docs/design/precision.md has the details.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "algorithm_cache.h"
#include "descriptors.h"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "weft/checked_call.h"
#include "weft/error.h"
#include "weft/profiler.h"

namespace weft::kernels::gpu {
namespace {

using detail::ConvolutionDescriptor;
using detail::cudnn_type;
using detail::FilterDescriptor;
using detail::nchw_tensor;
using detail::tensor_4d;
using detail::TensorDescriptor;
using detail::to_int;

enum class Direction { forward, backward_data, backward_filter };

const char* direction_name(Direction d) {
  switch (d) {
    case Direction::forward: return "fwd";
    case Direction::backward_data: return "bwd data";
    case Direction::backward_filter: return "bwd filter";
  }
  return "?";
}

std::string algo_name(Direction d, int algo) {
  static constexpr std::array<const char*, 8> fwd{"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                                  "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static constexpr std::array<const char*, 6> data{"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD",
                                                   "WINOGRAD_NONFUSED"};
  static constexpr std::array<const char*, 7> filter{"ALGO_0",   "ALGO_1",           "FFT",       "ALGO_3",
                                                     "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  const auto pick = [algo](const auto& names) -> std::string {
    return algo >= 0 && static_cast<std::size_t>(algo) < names.size() ? names[static_cast<std::size_t>(algo)]
                                                                       : "algo " + std::to_string(algo);
  };
  switch (d) {
    case Direction::forward: return pick(fwd);
    case Direction::backward_data: return pick(data);
    case Direction::backward_filter: return pick(filter);
  }
  return "?";
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "default math";
    case CUDNN_TENSOR_OP_MATH: return "tensor ops";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor ops, conversion";
    case CUDNN_FMA_MATH: return "fma";
  }
  return "?";
}

std::string bytes_text(std::size_t bytes) {
  char buf[32];
  if (bytes < 1024) return std::to_string(bytes) + " B";
  if (bytes < (std::size_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

// "n256 c64 h28 w28 o64 k3x3 s1 p1 bfloat16 nhwc": the geometry as errors
// and notes name it.
std::string geometry_text(const ConvGeometry& g) {
  char buf[192];
  std::snprintf(buf, sizeof buf, "n%lld c%lld h%lld w%lld o%lld k%lldx%lld s%lld p%lld %s%s%s",
                static_cast<long long>(g.n), static_cast<long long>(g.c), static_cast<long long>(g.h),
                static_cast<long long>(g.w), static_cast<long long>(g.o), static_cast<long long>(g.kh),
                static_cast<long long>(g.kw), static_cast<long long>(g.stride), static_cast<long long>(g.pad),
                std::string(to_string(g.dtype)).c_str(), g.dtype == DType::float32 && g.tf32 ? " tf32" : "",
                g.nhwc ? " nhwc" : "");
  return buf;
}

struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_FMA_MATH;
  std::size_t bytes = 0;
};

struct ConvPlan {
  TensorDescriptor x, y, bias;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  cudnnMathType_t query_math = CUDNN_FMA_MATH;  // what the ranking and the trial runs are asked for
  bool strict = true;                           // float32 without tf32: FMA-only algorithms first
};

// Sizes of one convolution after validation; `degenerate` when some tensor is
// empty, which cuDNN rejects (zero dimensions) and which needs no convolution.
struct Shape {
  std::int64_t oh = 0, ow = 0;
  bool x_empty = false, w_empty = false, y_empty = false;
  bool degenerate() const { return x_empty || w_empty || y_empty; }
};

Shape check_shape(const ConvGeometry& g, const char* op) {
  if (g.n < 0 || g.c < 0 || g.h < 0 || g.w < 0 || g.o < 0 || g.kh < 1 || g.kw < 1 || g.stride < 1 || g.pad < 0)
    throw weft::Error(std::string(op) + ": invalid convolution geometry (stride " + std::to_string(g.stride) +
                      ", pad " + std::to_string(g.pad) + ", kernel " + std::to_string(g.kh) + "x" +
                      std::to_string(g.kw) + ")");
  (void)cudnn_type(g.dtype, op);
  Shape s;
  const bool fits_h = g.h + 2 * g.pad >= g.kh, fits_w = g.w + 2 * g.pad >= g.kw;
  s.oh = fits_h ? g.out_h() : 0;
  s.ow = fits_w ? g.out_w() : 0;
  s.x_empty = g.n * g.c * g.h * g.w == 0;
  s.w_empty = g.o * g.c * g.kh * g.kw == 0;
  s.y_empty = g.n * g.o * s.oh * s.ow == 0;
  return s;
}

// A worker's descriptors for one geometry: n, c, h, w, o, kh, kw, stride,
// pad, dtype, layout, tf32.
using PlanKey = std::array<std::int64_t, 12>;

// One algorithm choice: the descriptors' key, then the direction, the
// algorithm mode (benchmark, deterministic) and the workspace a choice must
// fit. Per device (the cache is), so the device is not in it.
using ChoiceKey = std::array<std::int64_t, 16>;
using ChoiceCache = AlgorithmCache<ChoiceKey, Choice>;
using PlanCache = AlgorithmCache<PlanKey, std::shared_ptr<ConvPlan>>;

PlanKey plan_key(const ConvGeometry& g) {
  const bool tf32 = g.dtype == DType::float32 && g.tf32;  // ignored for halves
  return PlanKey{g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.stride, g.pad, static_cast<std::int64_t>(g.dtype),
                 g.nhwc ? 1 : 0, tf32 ? 1 : 0};
}

std::size_t usable_workspace(const WorkerHandles& h) { return h.workspace == nullptr ? 0 : h.workspace_bytes; }

ChoiceKey choice_key(const WorkerHandles& h, const ConvGeometry& g, Direction dir) {
  const PlanKey p = plan_key(g);
  ChoiceKey k{};
  std::copy(p.begin(), p.end(), k.begin());
  k[12] = static_cast<std::int64_t>(dir);
  k[13] = g.algo.benchmark ? 1 : 0;
  k[14] = g.algo.deterministic ? 1 : 0;
  k[15] = static_cast<std::int64_t>(usable_workspace(h));
  return k;
}

// The device's choices, made on first use with WEFT_CUDNN_CACHE_SIZE entries
// (a malformed value fails the op, naming the variable, until it is fixed).
ChoiceCache& choices_for(const WorkerHandles& h) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<ChoiceCache>> caches;
  std::lock_guard lock(mu);
  std::unique_ptr<ChoiceCache>& c = caches[h.device.index()];
  if (!c) c = std::make_unique<ChoiceCache>(algorithm_cache_size_from_env());
  return *c;
}

std::shared_ptr<ConvPlan> make_plan(const ConvGeometry& g, const Shape& s, const char* op);

// The calling worker's descriptors for g (shared_ptr: an eviction while the
// caller holds them leaves them alive).
std::shared_ptr<ConvPlan> plan_for(const ConvGeometry& g, const Shape& s, const char* op) {
  thread_local std::unique_ptr<PlanCache> cache;
  if (!cache) cache = std::make_unique<PlanCache>(algorithm_cache_size_from_env());
  const auto build = [&] { return make_plan(g, s, op); };
  return cache->get(plan_key(g), false, build, build);
}

std::shared_ptr<ConvPlan> make_plan(const ConvGeometry& g, const Shape& s, const char* op) {
  const bool tf32 = g.dtype == DType::float32 && g.tf32;
  auto plan = std::make_shared<ConvPlan>();
  const cudnnDataType_t type = cudnn_type(g.dtype, op);
  const int n = to_int(g.n, "n", op), c = to_int(g.c, "c", op), hh = to_int(g.h, "h", op), w = to_int(g.w, "w", op);
  const int o = to_int(g.o, "o", op), kh = to_int(g.kh, "kh", op), kw = to_int(g.kw, "kw", op);
  const int oh = to_int(s.oh, "out_h", op), ow = to_int(s.ow, "out_w", op);
  const int stride = to_int(g.stride, "stride", op), pad = to_int(g.pad, "pad", op);
  plan->x = tensor_4d(g.nhwc, n, c, hh, w, type);
  plan->y = tensor_4d(g.nhwc, n, o, oh, ow, type);
  plan->bias = nchw_tensor(1, o, 1, 1, type);
  WEFT_CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(plan->w, type, g.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, o, c, kh, kw));
  // Cross-correlation (no filter flip) is what the CPU kernel and every deep
  // learning framework call convolution; the compute type is float32 for
  // every data type.
  WEFT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan->conv, pad, pad, stride, stride, 1, 1,
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  plan->strict = g.dtype == DType::float32 && !tf32;
  plan->query_math = plan->strict ? CUDNN_FMA_MATH : (g.dtype == DType::float32 ? CUDNN_DEFAULT_MATH
                                                                                 : CUDNN_TENSOR_OP_MATH);
  int rn = 0, rc = 0, rh = 0, rw = 0;
  WEFT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan->conv, plan->x, plan->w, &rn, &rc, &rh, &rw));
  if (rn != n || rc != o || rh != oh || rw != ow)
    throw weft::Error(std::string(op) + ": cuDNN computes output " + std::to_string(rh) + "x" + std::to_string(rw) +
                      ", the geometry " + std::to_string(oh) + "x" + std::to_string(ow));
  return plan;
}

// Whether the worker's stream is being captured into a CUDA graph: trial
// runs synchronize, which a capture forbids, so benchmark mode then takes
// the heuristic's choice for that key, provisionally.
bool capturing(const WorkerHandles& h) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  WEFT_CUDA_CHECK(cudaStreamIsCapturing(detail::cuda_stream(h), &status));
  return status != cudaStreamCaptureStatusNone;
}

// Walks a ranking (cuDNN's heuristic order, or the trial runs' by time) and
// takes the first acceptable algorithm whose exact workspace, asked of cuDNN
// for (algo, math type) by `bytes_for`, fits the worker's. Strict float32
// looks at FMA-only algorithms first and only then at the rest.
template <class Perf, class BytesFor>
Choice pick(const std::vector<Perf>& perf, int returned, const WorkerHandles& h, const ConvPlan& plan,
            const ConvGeometry& g, Direction dir, bool benchmarked, BytesFor bytes_for, const char* op) {
  std::vector<RankedAlgorithm> ranking;
  for (int i = 0; i < returned; ++i) {
    const Perf& p = perf[static_cast<std::size_t>(i)];
    ranking.push_back({static_cast<int>(p.algo), p.status == CUDNN_STATUS_SUCCESS,
                       p.determinism == CUDNN_DETERMINISTIC, p.mathType == CUDNN_FMA_MATH});
  }
  std::size_t smallest = static_cast<std::size_t>(-1);
  for (const std::size_t i : candidate_order(ranking, g.algo.deterministic, plan.strict)) {
    const Perf& p = perf[i];
    WEFT_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv, p.mathType));
    const std::size_t bytes = bytes_for(p.algo);
    if (bytes < smallest) smallest = bytes;
    if (bytes > h.workspace_bytes || (bytes > 0 && h.workspace == nullptr)) continue;
    const Choice c{static_cast<int>(p.algo), p.mathType, bytes};
    char time[48];
    if (benchmarked && p.time >= 0)
      std::snprintf(time, sizeof time, "%.3f ms (benchmark)", static_cast<double>(p.time));
    else if (p.time >= 0)
      std::snprintf(time, sizeof time, "%.3f ms (heuristic estimate)", static_cast<double>(p.time));
    else
      std::snprintf(time, sizeof time, "time unknown (heuristic)");
    const std::string key = std::string("conv2d ") + direction_name(dir) + " " + geometry_text(g) +
                            (g.algo.deterministic ? " deterministic" : "") + " gpu(" +
                            std::to_string(h.device.index()) + ")";
    weft::Profiler::note(key, key + ": algo " + algo_name(dir, c.algo) + " (" + math_name(c.math) + ") " + time +
                                  ", workspace " + bytes_text(bytes));
    return c;
  }
  throw weft::Error(std::string(op) + ": no cuDNN " + (g.algo.deterministic ? "deterministic " : "") +
                    "algorithm for " + geometry_text(g) + " (" + direction_name(dir) +
                    ") fits the worker's workspace of " + std::to_string(h.workspace_bytes) + " bytes" +
                    (smallest != static_cast<std::size_t>(-1) ? " (the smallest needs " + std::to_string(smallest) + ")"
                                                              : std::string(" (cuDNN offered none)")));
}

// The workspace a trial run may use: the worker's, or none.
void* trial_workspace(const WorkerHandles& h) { return h.workspace; }
std::size_t trial_bytes(const WorkerHandles& h) { return h.workspace == nullptr ? 0 : h.workspace_bytes; }

// One direction's choice by trial runs (`trial`) or cuDNN's ranking, on the
// calling worker's descriptors.
Choice find_forward(const WorkerHandles& h, const ConvPlan& p, const ConvGeometry& g, const void* x, const void* w,
                    void* y, bool trial, const char* op) {
  WEFT_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.query_math));
  int max_count = 0, returned = 0;
  WEFT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h.cudnn, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(max_count > 0 ? max_count : 1));
  if (trial)
    WEFT_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h.cudnn, p.x, x, p.w, w, p.conv, p.y, y, max_count,
                                                            &returned, perf.data(), trial_workspace(h),
                                                            trial_bytes(h)));
  else
    WEFT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h.cudnn, p.x, p.w, p.conv, p.y, max_count, &returned,
                                                            perf.data()));
  return pick(perf, returned, h, p, g, Direction::forward, trial,
              [&](cudnnConvolutionFwdAlgo_t algo) {
                std::size_t bytes = 0;
                WEFT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h.cudnn, p.x, p.w, p.conv, p.y, algo, &bytes));
                return bytes;
              },
              op);
}

Choice find_backward_data(const WorkerHandles& h, const ConvPlan& p, const ConvGeometry& g, const void* w,
                          const void* dy, void* dx, bool trial, const char* op) {
  WEFT_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.query_math));
  int max_count = 0, returned = 0;
  WEFT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h.cudnn, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<std::size_t>(max_count > 0 ? max_count : 1));
  if (trial)
    WEFT_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h.cudnn, p.w, w, p.y, dy, p.conv, p.x, dx, max_count,
                                                                 &returned, perf.data(), trial_workspace(h),
                                                                 trial_bytes(h)));
  else
    WEFT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h.cudnn, p.w, p.y, p.conv, p.x, max_count, &returned,
                                                                 perf.data()));
  return pick(perf, returned, h, p, g, Direction::backward_data, trial,
              [&](cudnnConvolutionBwdDataAlgo_t algo) {
                std::size_t bytes = 0;
                WEFT_CUDNN_CHECK(
                    cudnnGetConvolutionBackwardDataWorkspaceSize(h.cudnn, p.w, p.y, p.conv, p.x, algo, &bytes));
                return bytes;
              },
              op);
}

Choice find_backward_filter(const WorkerHandles& h, const ConvPlan& p, const ConvGeometry& g, const void* x,
                            const void* dy, void* dw, bool trial, const char* op) {
  WEFT_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.query_math));
  int max_count = 0, returned = 0;
  WEFT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h.cudnn, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<std::size_t>(max_count > 0 ? max_count : 1));
  if (trial)
    WEFT_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h.cudnn, p.x, x, p.y, dy, p.conv, p.w, dw,
                                                                   max_count, &returned, perf.data(),
                                                                   trial_workspace(h), trial_bytes(h)));
  else
    WEFT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h.cudnn, p.x, p.y, p.conv, p.w, max_count,
                                                                   &returned, perf.data()));
  return pick(perf, returned, h, p, g, Direction::backward_filter, trial,
              [&](cudnnConvolutionBwdFilterAlgo_t algo) {
                std::size_t bytes = 0;
                WEFT_CUDNN_CHECK(
                    cudnnGetConvolutionBackwardFilterWorkspaceSize(h.cudnn, p.x, p.y, p.conv, p.w, algo, &bytes));
                return bytes;
              },
              op);
}

// A direction's choice from the device's cache. Benchmark mode measures
// (trial runs) outside capture; while the worker's stream is captured the
// heuristic's pick is taken provisionally and the cache never calls the
// measurement. Heuristic mode's pick is final either way (no trial runs).
template <class Find>
Choice choose(const WorkerHandles& h, const ConvGeometry& g, Direction dir, Find find) {
  const bool benchmark = g.algo.benchmark;
  const bool captured = benchmark && capturing(h);
  return choices_for(h).get(choice_key(h, g, dir), captured, [&] { return find(benchmark); },
                            [&] { return find(false); });
}

// The three directions share one convolution descriptor but may have picked
// different math types.
void use(const ConvPlan& p, const Choice& c) { WEFT_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, c.math)); }

void* workspace_for(const WorkerHandles& h, const Choice& c) { return c.bytes == 0 ? nullptr : h.workspace; }

using detail::kOne;
using detail::kZero;

// y += b broadcast over N, H, W: cuDNN for float32, a float32-sum kernel for
// the halves; NHWC y is [N*OH*OW, O] rows, each getting b.
void add_channel_bias(const WorkerHandles& h, const ConvGeometry& g, const Shape& s,
                      cudnnTensorDescriptor_t bias_desc, const void* b, cudnnTensorDescriptor_t y_desc, void* y) {
  if (g.nhwc) return detail::add_row_bias(h, g.dtype, y, b, g.n * s.oh * s.ow, g.o);
  if (g.dtype != DType::float32) return detail::add_channel_bias(h, g.dtype, y, b, g.n, g.o, s.oh * s.ow);
  WEFT_CUDNN_CHECK(cudnnAddTensor(h.cudnn, &kOne, bias_desc, b, &kOne, y_desc, y));
}

// db = dy summed over N, H, W: cuDNN for float32, a double-accumulating
// kernel for the halves; NHWC dy's column sums.
void channel_sums(const WorkerHandles& h, const ConvGeometry& g, const Shape& s, cudnnTensorDescriptor_t dy_desc,
                  const void* dy, cudnnTensorDescriptor_t db_desc, void* db) {
  if (g.nhwc) return detail::column_sums(h, g.dtype, db, dy, g.n * s.oh * s.ow, g.o);
  if (g.dtype != DType::float32) return detail::channel_sums(h, g.dtype, db, dy, g.n, g.o, s.oh * s.ow);
  WEFT_CUDNN_CHECK(cudnnConvolutionBackwardBias(h.cudnn, &kOne, dy_desc, dy, &kZero, db_desc, db));
}

}  // namespace

void conv2d_forward(const WorkerHandles& h, void* y, const void* x, const void* w, const void* b,
                    const ConvGeometry& g) {
  constexpr const char* op = "conv2d_forward";
  const Shape s = check_shape(g, op);
  if (s.y_empty) return;
  WEFT_CUDNN_CHECK(cudnnSetStream(h.cudnn, detail::cuda_stream(h)));
  if (s.degenerate()) {
    // No input channels (or an empty filter): the sum over them is 0, leaving the bias.
    detail::zero(h, g.dtype, y, g.n * g.o * s.oh * s.ow);
    if (b != nullptr) {
      const cudnnDataType_t type = cudnn_type(g.dtype, op);
      const TensorDescriptor yd = tensor_4d(g.nhwc, to_int(g.n, "n", op), to_int(g.o, "o", op),
                                            to_int(s.oh, "out_h", op), to_int(s.ow, "out_w", op), type);
      const TensorDescriptor bd = nchw_tensor(1, to_int(g.o, "o", op), 1, 1, type);
      add_channel_bias(h, g, s, bd, b, yd, y);
    }
    return;
  }
  const std::shared_ptr<ConvPlan> plan = plan_for(g, s, op);
  const ConvPlan& p = *plan;
  const Choice c = choose(h, g, Direction::forward,
                          [&](bool trial) { return find_forward(h, p, g, x, w, y, trial, op); });
  use(p, c);
  WEFT_CUDNN_CHECK(cudnnConvolutionForward(h.cudnn, &kOne, p.x, x, p.w, w, p.conv,
                                           static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), workspace_for(h, c),
                                           c.bytes, &kZero, p.y, y));
  if (b != nullptr) add_channel_bias(h, g, s, p.bias, b, p.y, y);
}

void conv2d_backward_data(const WorkerHandles& h, void* dx, const void* dy, const void* w, const ConvGeometry& g) {
  constexpr const char* op = "conv2d_backward_data";
  const Shape s = check_shape(g, op);
  if (s.x_empty) return;
  if (s.degenerate()) return detail::zero(h, g.dtype, dx, g.n * g.c * g.h * g.w);  // nothing flows back
  WEFT_CUDNN_CHECK(cudnnSetStream(h.cudnn, detail::cuda_stream(h)));
  const std::shared_ptr<ConvPlan> plan = plan_for(g, s, op);
  const ConvPlan& p = *plan;
  const Choice c = choose(h, g, Direction::backward_data,
                          [&](bool trial) { return find_backward_data(h, p, g, w, dy, dx, trial, op); });
  use(p, c);
  WEFT_CUDNN_CHECK(cudnnConvolutionBackwardData(h.cudnn, &kOne, p.w, w, p.y, dy, p.conv,
                                                static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
                                                workspace_for(h, c), c.bytes, &kZero, p.x, dx));
}

void conv2d_backward_filter(const WorkerHandles& h, void* dw, void* db, const void* x, const void* dy,
                            const ConvGeometry& g) {
  constexpr const char* op = "conv2d_backward_filter";
  const Shape s = check_shape(g, op);
  WEFT_CUDNN_CHECK(cudnnSetStream(h.cudnn, detail::cuda_stream(h)));
  if (s.degenerate()) {
    // An empty batch or output contributes no gradient; with no input
    // channels the bias still gets the sum of dy.
    if (dw != nullptr) detail::zero(h, g.dtype, dw, g.o * g.c * g.kh * g.kw);
    if (db != nullptr && g.o > 0) {
      if (s.y_empty) {
        detail::zero(h, g.dtype, db, g.o);
      } else {
        const cudnnDataType_t type = cudnn_type(g.dtype, op);
        const TensorDescriptor yd = tensor_4d(g.nhwc, to_int(g.n, "n", op), to_int(g.o, "o", op),
                                              to_int(s.oh, "out_h", op), to_int(s.ow, "out_w", op), type);
        const TensorDescriptor bd = nchw_tensor(1, to_int(g.o, "o", op), 1, 1, type);
        channel_sums(h, g, s, yd, dy, bd, db);
      }
    }
    return;
  }
  const std::shared_ptr<ConvPlan> plan = plan_for(g, s, op);
  const ConvPlan& p = *plan;
  if (dw != nullptr) {
    const Choice c = choose(h, g, Direction::backward_filter,
                            [&](bool trial) { return find_backward_filter(h, p, g, x, dy, dw, trial, op); });
    use(p, c);
    WEFT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h.cudnn, &kOne, p.x, x, p.y, dy, p.conv,
                                                    static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
                                                    workspace_for(h, c), c.bytes, &kZero, p.w, dw));
  }
  if (db != nullptr) channel_sums(h, g, s, p.y, dy, p.bias, db);
}

}  // namespace weft::kernels::gpu
