// GPU kernels: the same operations as ../cpu/cpu_kernels.h, same argument
// order and meaning, on device pointers, enqueued on h.stream and never
// synchronizing it (the engine completes GPU ops by recording an event). Only
// compiled when CUDA is (WEFT_HAVE_CUDA); errors go through WEFT_CUDA_CHECK /
// WEFT_CUBLAS_CHECK / WEFT_CUDNN_CHECK (weft/checked_call.h) and throw
// weft::Error naming the call, the op and the device.
#pragma once

#include <cstdint>

#include "../conv_geometry.h"
#include "weft/gpu.h"

namespace weft::kernels::gpu {

using weft::gpu::WorkerHandles;

void fill(const WorkerHandles& h, float* y, std::int64_t n, float value);
void uniform(const WorkerHandles& h, float* y, std::int64_t n, float lo, float hi, std::uint64_t seed);
void normal(const WorkerHandles& h, float* y, std::int64_t n, float mean, float stddev, std::uint64_t seed);

void add(const WorkerHandles& h, float* y, const float* a, const float* b, std::int64_t n);
void sub(const WorkerHandles& h, float* y, const float* a, const float* b, std::int64_t n);
void mul(const WorkerHandles& h, float* y, const float* a, const float* b, std::int64_t n);
void maximum(const WorkerHandles& h, float* y, const float* a, const float* b, std::int64_t n);
void add_scalar(const WorkerHandles& h, float* y, const float* x, float s, std::int64_t n);
void mul_scalar(const WorkerHandles& h, float* y, const float* x, float s, std::int64_t n);
void axpy(const WorkerHandles& h, float* y, float alpha, const float* x, std::int64_t n);
void relu(const WorkerHandles& h, float* y, const float* x, std::int64_t n);
void relu_grad(const WorkerHandles& h, float* dx, const float* x, const float* dy, std::int64_t n);

void sum(const WorkerHandles& h, float* y, const float* x, std::int64_t n);  // *y (device) = sum
void argmax_rows(const WorkerHandles& h, float* y, const float* x, std::int64_t rows, std::int64_t cols);

// Row-major, as the CPU gemm (cuBLAS is column-major: the wrapper swaps).
void gemm(const WorkerHandles& h, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);

void dense_forward(const WorkerHandles& h, float* y, const float* x, const float* w, const float* b,
                   std::int64_t batch, std::int64_t in, std::int64_t out);
void dense_backward(const WorkerHandles& h, float* dx, float* dw, float* db, const float* x, const float* w,
                    const float* dy, std::int64_t batch, std::int64_t in, std::int64_t out);

// cuDNN.
void conv2d_forward(const WorkerHandles& h, float* y, const float* x, const float* w, const float* b,
                    const ConvGeometry& g);
void conv2d_backward_data(const WorkerHandles& h, float* dx, const float* dy, const float* w, const ConvGeometry& g);
void conv2d_backward_filter(const WorkerHandles& h, float* dw, float* db, const float* x, const float* dy,
                            const ConvGeometry& g);
void avg_pool2d_forward(const WorkerHandles& h, float* y, const float* x, const PoolGeometry& g);
void avg_pool2d_backward(const WorkerHandles& h, float* dx, const float* dy, const PoolGeometry& g);
void max_pool2d_forward(const WorkerHandles& h, float* y, const float* x, const PoolGeometry& g);
void max_pool2d_backward(const WorkerHandles& h, float* dx, const float* x, const float* dy, const PoolGeometry& g);
void global_avg_pool2d_forward(const WorkerHandles& h, float* y, const float* x, std::int64_t planes,
                               std::int64_t hw);
void global_avg_pool2d_backward(const WorkerHandles& h, float* dx, const float* dy, std::int64_t planes,
                                std::int64_t hw);

// cuDNN's spatial batch normalization (the legacy API, deprecated in cuDNN 9
// but present; the same conventions as the CPU kernels).
void batch_norm_forward_train(const WorkerHandles& h, float* y, float* save_mean, float* save_invstd,
                              float* running_mean, float* running_var, const float* x, const float* gamma,
                              const float* beta, const BatchNormGeometry& g, float eps, float momentum);
void batch_norm_forward_infer(const WorkerHandles& h, float* y, const float* x, const float* gamma, const float* beta,
                              const float* running_mean, const float* running_var, const BatchNormGeometry& g,
                              float eps);
void batch_norm_backward(const WorkerHandles& h, float* dx, float* dgamma, float* dbeta, const float* x,
                         const float* dy, const float* gamma, const float* save_mean, const float* save_invstd,
                         const BatchNormGeometry& g, float eps);

// Labels out of range make the loss NaN on the GPU (checked on the host would
// need a synchronize); the op layer validates labels it creates from host data.
void softmax_cross_entropy(const WorkerHandles& h, float* loss, float* dlogits, const float* logits,
                           const float* labels, std::int64_t rows, std::int64_t cols);
void sgd_update(const WorkerHandles& h, float* w, const float* g, std::int64_t n, float lr, float weight_decay);

}  // namespace weft::kernels::gpu
