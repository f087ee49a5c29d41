// Spatial batch normalization through cuDNN's legacy API
// (cudnnBatchNormalization{ForwardTraining,ForwardInference,Backward}).
// cuDNN 9 marks these deprecated in favour of its graph API; they are still
// shipped and are what frameworks on cuDNN 9 call, so the deprecation warning
// is silenced here, in this one file.
//
// Conventions, matching the CPU kernels: x viewed as [N, C, HW, 1] (NCHW, or
// NHWC for channels-last data: BatchNormGeometry::nhwc); the
// scale/bias/statistics descriptor [1, C, 1, 1]; the running variance takes
// the unbiased batch variance; exponentialAverageFactor = momentum; the
// saved statistics are the batch mean and 1 / sqrt(var + eps), which the
// backward reuses. x, y, dx, dy may be half; gamma, beta, the statistics and
// their gradients are float32 (the descriptor cudnnDeriveBNTensorDescriptor
// derives, float for half data), so statistics accumulate in float32.
// Descriptors are host objects built per call (cheap, no GPU work); every
// call is enqueued on the worker's stream.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <string>

#include "descriptors.h"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "weft/checked_call.h"
#include "weft/error.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace weft::kernels::gpu {
namespace {

using detail::cudnn_type;
using detail::TensorDescriptor;
using detail::to_int;

using detail::kOne;
using detail::kZero;

struct Descriptors {
  TensorDescriptor x, stats;
};

// Nothing to normalize (cuDNN rejects zero dimensions).
bool empty(const BatchNormGeometry& g) { return g.n == 0 || g.c == 0 || g.hw == 0; }

Descriptors descriptors(DType t, const BatchNormGeometry& g, const char* op) {
  if (g.n < 0 || g.c < 0 || g.hw < 0)
    throw weft::Error(std::string(op) + ": invalid geometry (n " + std::to_string(g.n) + ", c " +
                      std::to_string(g.c) + ", hw " + std::to_string(g.hw) + ")");
  Descriptors d{detail::tensor_4d(g.nhwc, to_int(g.n, "n", op), to_int(g.c, "c", op), to_int(g.hw, "h*w", op), 1,
                                  cudnn_type(t, op)),
                {}};
  WEFT_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(d.stats, d.x, CUDNN_BATCHNORM_SPATIAL));
  return d;
}

double checked_eps(float eps, const char* op) {
  if (static_cast<double>(eps) < CUDNN_BN_MIN_EPSILON)
    throw weft::Error(std::string(op) + ": eps " + std::to_string(eps) + " is below cuDNN's minimum " +
                      std::to_string(CUDNN_BN_MIN_EPSILON));
  return eps;
}

}  // namespace

void batch_norm_forward_train(const WorkerHandles& h, DType t, void* y, float* save_mean, float* save_invstd,
                              float* running_mean, float* running_var, const void* x, const float* gamma,
                              const float* beta, const BatchNormGeometry& g, float eps, float momentum) {
  constexpr const char* op = "batch_norm_forward_train";
  (void)cudnn_type(t, op);
  if (g.per_channel() < 2)
    throw weft::Error(std::string(op) + ": training needs at least 2 values per channel, got " +
                      std::to_string(g.per_channel()));
  if (empty(g)) return;
  const Descriptors d = descriptors(t, g, op);
  WEFT_CUDNN_CHECK(cudnnSetStream(h.cudnn, detail::cuda_stream(h)));
  WEFT_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      h.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, d.x, x, d.x, y, d.stats, gamma, beta,
      static_cast<double>(momentum), running_mean, running_var, checked_eps(eps, op), save_mean, save_invstd));
}

void batch_norm_forward_infer(const WorkerHandles& h, DType t, void* y, const void* x, const float* gamma,
                              const float* beta, const float* running_mean, const float* running_var,
                              const BatchNormGeometry& g, float eps) {
  constexpr const char* op = "batch_norm_forward_infer";
  (void)cudnn_type(t, op);
  if (empty(g)) return;
  const Descriptors d = descriptors(t, g, op);
  WEFT_CUDNN_CHECK(cudnnSetStream(h.cudnn, detail::cuda_stream(h)));
  WEFT_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(h.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, d.x, x,
                                                           d.x, y, d.stats, gamma, beta, running_mean, running_var,
                                                           checked_eps(eps, op)));
}

void batch_norm_backward(const WorkerHandles& h, DType t, void* dx, float* dgamma, float* dbeta, const void* x,
                         const void* dy, const float* gamma, const float* save_mean, const float* save_invstd,
                         const BatchNormGeometry& g, float eps) {
  constexpr const char* op = "batch_norm_backward";
  (void)cudnn_type(t, op);
  if (empty(g)) {
    // No values: the parameter gradients are sums over nothing.
    if (g.c > 0) {
      detail::zero(h, dgamma, g.c);
      detail::zero(h, dbeta, g.c);
    }
    return;
  }
  const Descriptors d = descriptors(t, g, op);
  WEFT_CUDNN_CHECK(cudnnSetStream(h.cudnn, detail::cuda_stream(h)));
  WEFT_CUDNN_CHECK(cudnnBatchNormalizationBackward(h.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero,
                                                   d.x, x, d.x, dy, d.x, dx, d.stats, gamma, dgamma, dbeta,
                                                   checked_eps(eps, op), save_mean, save_invstd));
}

}  // namespace weft::kernels::gpu
