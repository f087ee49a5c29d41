// 2-D convolution through cuDNN 9's legacy API.
//
// Plans (descriptors plus the chosen algorithms) are cached per thread, keyed
// by geometry, device and workspace size: each engine worker owns its cuDNN
// handle and calls from its own thread, so the cache needs no lock, and a
// training loop hits the same few geometries every step.
//
// Algorithm choice: cuDNN's heuristic ranking (the *_v7 queries, no trial
// runs, no synchronization), filtered to algorithms whose workspace fits the
// worker's. Within that ranking, FMA-only (plain float32) deterministic
// algorithms come first, then FMA-only ones, then anything: TF32 tensor-core
// kernels would drift from the CPU results by ~1e-3, and nondeterministic
// (atomic) backward-filter kernels make gradients differ run to run. Only
// when no FMA-only algorithm fits does one run with the math type cuDNN
// reported for it (possibly TF32); none fitting at all is a weft::Error.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "descriptors.h"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "weft/checked_call.h"
#include "weft/error.h"

namespace weft::kernels::gpu {
namespace {

using detail::ConvolutionDescriptor;
using detail::FilterDescriptor;
using detail::nchw_tensor;
using detail::TensorDescriptor;
using detail::to_int;

struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_FMA_MATH;
  std::size_t bytes = 0;
};

struct ConvPlan {
  TensorDescriptor x, y, bias;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  std::optional<Choice> fwd, bwd_data, bwd_filter;
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
  Shape s;
  const bool fits_h = g.h + 2 * g.pad >= g.kh, fits_w = g.w + 2 * g.pad >= g.kw;
  s.oh = fits_h ? g.out_h() : 0;
  s.ow = fits_w ? g.out_w() : 0;
  s.x_empty = g.n * g.c * g.h * g.w == 0;
  s.w_empty = g.o * g.c * g.kh * g.kw == 0;
  s.y_empty = g.n * g.o * s.oh * s.ow == 0;
  return s;
}

using PlanKey = std::array<std::int64_t, 11>;

ConvPlan& plan_for(const WorkerHandles& h, const ConvGeometry& g, const Shape& s, const char* op) {
  thread_local std::map<PlanKey, std::unique_ptr<ConvPlan>> cache;
  const PlanKey key{g.n,      g.c,   g.h, g.w, g.o, g.kh, g.kw, g.stride, g.pad, h.device.index(),
                    static_cast<std::int64_t>(h.workspace_bytes)};
  if (auto it = cache.find(key); it != cache.end()) return *it->second;
  // Bounded: a workload with ever-changing shapes (variable batch tails, say)
  // must not grow host memory without limit; rebuilding a plan is cheap.
  if (cache.size() >= 64) cache.clear();

  auto plan = std::make_unique<ConvPlan>();
  const int n = to_int(g.n, "n", op), c = to_int(g.c, "c", op), hh = to_int(g.h, "h", op), w = to_int(g.w, "w", op);
  const int o = to_int(g.o, "o", op), kh = to_int(g.kh, "kh", op), kw = to_int(g.kw, "kw", op);
  const int oh = to_int(s.oh, "out_h", op), ow = to_int(s.ow, "out_w", op);
  const int stride = to_int(g.stride, "stride", op), pad = to_int(g.pad, "pad", op);
  plan->x = nchw_tensor(n, c, hh, w);
  plan->y = nchw_tensor(n, o, oh, ow);
  plan->bias = nchw_tensor(1, o, 1, 1);
  WEFT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, o, c, kh, kw));
  // Cross-correlation (no filter flip) is what the CPU kernel and every deep
  // learning framework call convolution.
  WEFT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan->conv, pad, pad, stride, stride, 1, 1,
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  int rn = 0, rc = 0, rh = 0, rw = 0;
  WEFT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan->conv, plan->x, plan->w, &rn, &rc, &rh, &rw));
  if (rn != n || rc != o || rh != oh || rw != ow)
    throw weft::Error(std::string(op) + ": cuDNN computes output " + std::to_string(rh) + "x" + std::to_string(rw) +
                      ", the geometry " + std::to_string(oh) + "x" + std::to_string(ow));
  return *cache.emplace(key, std::move(plan)).first->second;
}

// Walks cuDNN's ranking in preference tiers; `bytes_for` asks cuDNN for the
// exact workspace of (algo, math type) so the pick never overruns it.
template <class Perf, class BytesFor>
Choice pick(const std::vector<Perf>& perf, int returned, const WorkerHandles& h, cudnnConvolutionDescriptor_t conv,
            BytesFor bytes_for, const char* op) {
  std::size_t smallest = static_cast<std::size_t>(-1);
  for (int tier = 0; tier < 3; ++tier) {
    for (int i = 0; i < returned; ++i) {
      const Perf& p = perf[static_cast<std::size_t>(i)];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      const bool fma = p.mathType == CUDNN_FMA_MATH;
      const bool deterministic = p.determinism == CUDNN_DETERMINISTIC;
      if ((tier == 0 && !(fma && deterministic)) || (tier == 1 && !fma)) continue;
      WEFT_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, p.mathType));
      const std::size_t bytes = bytes_for(p.algo);
      if (bytes < smallest) smallest = bytes;
      if (bytes <= h.workspace_bytes && (bytes == 0 || h.workspace != nullptr))
        return Choice{static_cast<int>(p.algo), p.mathType, bytes};
    }
  }
  throw weft::Error(std::string(op) + ": no cuDNN algorithm fits the worker's workspace of " +
                    std::to_string(h.workspace_bytes) + " bytes" +
                    (smallest != static_cast<std::size_t>(-1) ? " (the smallest needs " + std::to_string(smallest) + ")"
                                                              : std::string(" (cuDNN offered none)")));
}

const Choice& forward_choice(const WorkerHandles& h, ConvPlan& p, const char* op) {
  if (!p.fwd) {
    WEFT_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, CUDNN_FMA_MATH));
    int max_count = 0, returned = 0;
    WEFT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h.cudnn, &max_count));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<std::size_t>(max_count > 0 ? max_count : 1));
    WEFT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h.cudnn, p.x, p.w, p.conv, p.y, max_count, &returned,
                                                            perf.data()));
    p.fwd = pick(perf, returned, h, p.conv,
                 [&](cudnnConvolutionFwdAlgo_t algo) {
                   std::size_t bytes = 0;
                   WEFT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h.cudnn, p.x, p.w, p.conv, p.y, algo, &bytes));
                   return bytes;
                 },
                 op);
  }
  return *p.fwd;
}

const Choice& backward_data_choice(const WorkerHandles& h, ConvPlan& p, const char* op) {
  if (!p.bwd_data) {
    WEFT_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, CUDNN_FMA_MATH));
    int max_count = 0, returned = 0;
    WEFT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h.cudnn, &max_count));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<std::size_t>(max_count > 0 ? max_count : 1));
    WEFT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h.cudnn, p.w, p.y, p.conv, p.x, max_count, &returned,
                                                                 perf.data()));
    p.bwd_data = pick(perf, returned, h, p.conv,
                      [&](cudnnConvolutionBwdDataAlgo_t algo) {
                        std::size_t bytes = 0;
                        WEFT_CUDNN_CHECK(
                            cudnnGetConvolutionBackwardDataWorkspaceSize(h.cudnn, p.w, p.y, p.conv, p.x, algo, &bytes));
                        return bytes;
                      },
                      op);
  }
  return *p.bwd_data;
}

const Choice& backward_filter_choice(const WorkerHandles& h, ConvPlan& p, const char* op) {
  if (!p.bwd_filter) {
    WEFT_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, CUDNN_FMA_MATH));
    int max_count = 0, returned = 0;
    WEFT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h.cudnn, &max_count));
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<std::size_t>(max_count > 0 ? max_count : 1));
    WEFT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h.cudnn, p.x, p.y, p.conv, p.w, max_count,
                                                                   &returned, perf.data()));
    p.bwd_filter = pick(perf, returned, h, p.conv,
                        [&](cudnnConvolutionBwdFilterAlgo_t algo) {
                          std::size_t bytes = 0;
                          WEFT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h.cudnn, p.x, p.y, p.conv,
                                                                                          p.w, algo, &bytes));
                          return bytes;
                        },
                        op);
  }
  return *p.bwd_filter;
}

// The three directions share one convolution descriptor but may have picked
// different math types.
void use(const ConvPlan& p, const Choice& c) { WEFT_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, c.math)); }

void* workspace_for(const WorkerHandles& h, const Choice& c) { return c.bytes == 0 ? nullptr : h.workspace; }

using detail::kOne;
using detail::kZero;

// y += b broadcast over N, H, W.
void add_channel_bias(const WorkerHandles& h, cudnnTensorDescriptor_t bias_desc, const float* b,
                      cudnnTensorDescriptor_t y_desc, float* y) {
  WEFT_CUDNN_CHECK(cudnnAddTensor(h.cudnn, &kOne, bias_desc, b, &kOne, y_desc, y));
}

// db = dy summed over N, H, W.
void channel_sums(const WorkerHandles& h, cudnnTensorDescriptor_t dy_desc, const float* dy,
                  cudnnTensorDescriptor_t db_desc, float* db) {
  WEFT_CUDNN_CHECK(cudnnConvolutionBackwardBias(h.cudnn, &kOne, dy_desc, dy, &kZero, db_desc, db));
}

}  // namespace

void conv2d_forward(const WorkerHandles& h, float* y, const float* x, const float* w, const float* b,
                    const ConvGeometry& g) {
  constexpr const char* op = "conv2d_forward";
  const Shape s = check_shape(g, op);
  if (s.y_empty) return;
  WEFT_CUDNN_CHECK(cudnnSetStream(h.cudnn, detail::cuda_stream(h)));
  if (s.degenerate()) {
    // No input channels (or an empty filter): the sum over them is 0, leaving the bias.
    detail::zero(h, y, g.n * g.o * s.oh * s.ow);
    if (b != nullptr) {
      const TensorDescriptor yd = nchw_tensor(to_int(g.n, "n", op), to_int(g.o, "o", op), to_int(s.oh, "out_h", op),
                                              to_int(s.ow, "out_w", op));
      const TensorDescriptor bd = nchw_tensor(1, to_int(g.o, "o", op), 1, 1);
      add_channel_bias(h, bd, b, yd, y);
    }
    return;
  }
  ConvPlan& p = plan_for(h, g, s, op);
  const Choice& c = forward_choice(h, p, op);
  use(p, c);
  WEFT_CUDNN_CHECK(cudnnConvolutionForward(h.cudnn, &kOne, p.x, x, p.w, w, p.conv,
                                           static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), workspace_for(h, c),
                                           c.bytes, &kZero, p.y, y));
  if (b != nullptr) add_channel_bias(h, p.bias, b, p.y, y);
}

void conv2d_backward_data(const WorkerHandles& h, float* dx, const float* dy, const float* w, const ConvGeometry& g) {
  constexpr const char* op = "conv2d_backward_data";
  const Shape s = check_shape(g, op);
  if (s.x_empty) return;
  if (s.degenerate()) return detail::zero(h, dx, g.n * g.c * g.h * g.w);  // nothing flows back
  WEFT_CUDNN_CHECK(cudnnSetStream(h.cudnn, detail::cuda_stream(h)));
  ConvPlan& p = plan_for(h, g, s, op);
  const Choice& c = backward_data_choice(h, p, op);
  use(p, c);
  WEFT_CUDNN_CHECK(cudnnConvolutionBackwardData(h.cudnn, &kOne, p.w, w, p.y, dy, p.conv,
                                                static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo),
                                                workspace_for(h, c), c.bytes, &kZero, p.x, dx));
}

void conv2d_backward_filter(const WorkerHandles& h, float* dw, float* db, const float* x, const float* dy,
                            const ConvGeometry& g) {
  constexpr const char* op = "conv2d_backward_filter";
  const Shape s = check_shape(g, op);
  WEFT_CUDNN_CHECK(cudnnSetStream(h.cudnn, detail::cuda_stream(h)));
  if (s.degenerate()) {
    // An empty batch or output contributes no gradient; with no input
    // channels the bias still gets the sum of dy.
    if (dw != nullptr) detail::zero(h, dw, g.o * g.c * g.kh * g.kw);
    if (db != nullptr && g.o > 0) {
      if (s.y_empty) {
        detail::zero(h, db, g.o);
      } else {
        const TensorDescriptor yd = nchw_tensor(to_int(g.n, "n", op), to_int(g.o, "o", op),
                                                to_int(s.oh, "out_h", op), to_int(s.ow, "out_w", op));
        const TensorDescriptor bd = nchw_tensor(1, to_int(g.o, "o", op), 1, 1);
        channel_sums(h, yd, dy, bd, db);
      }
    }
    return;
  }
  ConvPlan& p = plan_for(h, g, s, op);
  if (dw != nullptr) {
    const Choice& c = backward_filter_choice(h, p, op);
    use(p, c);
    WEFT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h.cudnn, &kOne, p.x, x, p.y, dy, p.conv,
                                                    static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo),
                                                    workspace_for(h, c), c.bytes, &kZero, p.w, dw));
  }
  if (db != nullptr) channel_sums(h, p.y, dy, p.bias, db);
}

}  // namespace weft::kernels::gpu
