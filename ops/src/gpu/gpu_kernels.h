// GPU kernels: the same operations as ../cpu/cpu_kernels.h, same argument
// order and meaning, on device pointers, enqueued on h.stream and never
// synchronizing it (the engine completes GPU ops by recording an event). Only
// compiled when CUDA is (WEFT_HAVE_CUDA); errors go through WEFT_CUDA_CHECK /
// WEFT_CUBLAS_CHECK / WEFT_CUDNN_CHECK (weft/checked_call.h) and throw
// weft::Error naming the call, the op and the device.
//
// Element types: `t` is the dtype of the data tensors of the call (float32,
// bfloat16 or float16), passed as void pointers; statistics, losses, labels,
// scales and SGD's master weights are always float32 (float pointers). Half
// kernels load into float32, compute and accumulate in float32, and round
// to nearest even on store; GEMMs and convolutions run on tensor cores with
// float32 accumulation (cuBLAS GemmEx, cuDNN with half data). `tf32` lets
// float32 GEMMs and convolutions use TF32 tensor cores (ignored for halves).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "../conv_geometry.h"
#include "../optim_math.h"
#include "weft/dtype.h"
#include "weft/gpu.h"

namespace weft::kernels::gpu {

using weft::gpu::WorkerHandles;

void fill(const WorkerHandles& h, DType t, void* y, std::int64_t n, float value);
void uniform(const WorkerHandles& h, float* y, std::int64_t n, float lo, float hi, std::uint64_t seed);
void normal(const WorkerHandles& h, float* y, std::int64_t n, float mean, float stddev, std::uint64_t seed);
// y (yt) = x (xt) converted: float32 -> half rounds to nearest even, NaN
// stays NaN and overflow becomes Inf; half -> float32 is exact.
void cast(const WorkerHandles& h, void* y, DType yt, const void* x, DType xt, std::int64_t n);

// Memory formats (layout.cu): y = x of n images, c channels, hw positions,
// elements of `elem` bytes (2 or 4), NCHW -> NHWC and NHWC -> NCHW.
void to_channels_last(const WorkerHandles& h, void* y, const void* x, std::int64_t n, std::int64_t c, std::int64_t hw,
                      std::size_t elem);
void to_channels_first(const WorkerHandles& h, void* y, const void* x, std::int64_t n, std::int64_t c,
                       std::int64_t hw, std::size_t elem);
// Axis permutation (layout.cu): as cpu::permute, elements of 1, 2, 4 or 8
// bytes, rank 1..6.
void permute(const WorkerHandles& h, void* y, const void* x, int rank, const std::int64_t* extent,
             const std::int64_t* src_stride, std::size_t elem);

void add(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n);
void sub(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n);
void mul(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n);
void maximum(const WorkerHandles& h, DType t, void* y, const void* a, const void* b, std::int64_t n);
void add_scalar(const WorkerHandles& h, DType t, void* y, const void* x, float s, std::int64_t n);
void mul_scalar(const WorkerHandles& h, DType t, void* y, const void* x, float s, std::int64_t n);
void axpy(const WorkerHandles& h, DType t, void* y, float alpha, const void* x, std::int64_t n);
// y = x * *factor (factor: one float32 on the device).
void scale_by(const WorkerHandles& h, DType t, void* y, const void* x, const float* factor, std::int64_t n);
void relu(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t n);
void relu_grad(const WorkerHandles& h, DType t, void* dx, const void* x, const void* dy, std::int64_t n);

// *y (device, dtype t) = sum, accumulated in double.
void sum(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t n);
// Indices as float32.
void argmax_rows(const WorkerHandles& h, DType t, float* y, const void* x, std::int64_t rows, std::int64_t cols);

// Row-major, as the CPU gemm (cuBLAS is column-major: the wrapper swaps).
void gemm(const WorkerHandles& h, DType t, bool tf32, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, float alpha, const void* a, std::int64_t lda, const void* b, std::int64_t ldb, float beta,
          void* c, std::int64_t ldc);

// cuBLAS strided-batched GEMM (cublasSgemmStridedBatched / GemmStridedBatchedEx),
// row-major as gemm; matrix i of A, B, C at i * stride_a / stride_b / stride_c.
void gemm_batched(const WorkerHandles& h, DType t, bool tf32, bool trans_a, bool trans_b, std::int64_t batch,
                  std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a, std::int64_t lda,
                  std::int64_t stride_a, const void* b, std::int64_t ldb, std::int64_t stride_b, float beta, void* c,
                  std::int64_t ldc, std::int64_t stride_c);

void dense_forward(const WorkerHandles& h, DType t, bool tf32, void* y, const void* x, const void* w, const void* b,
                   std::int64_t batch, std::int64_t in, std::int64_t out);
void dense_backward(const WorkerHandles& h, DType t, bool tf32, void* dx, void* dw, void* db, const void* x,
                    const void* w, const void* dy, std::int64_t batch, std::int64_t in, std::int64_t out);

// cuDNN. The geometry carries the element type, tf32, how the algorithm is
// chosen (ConvGeometry::algo) and the layout (ConvGeometry::nhwc: NHWC data
// and OHWI filters, CUDNN_TENSOR_NHWC descriptors).
void conv2d_forward(const WorkerHandles& h, void* y, const void* x, const void* w, const void* b,
                    const ConvGeometry& g);
void conv2d_backward_data(const WorkerHandles& h, void* dx, const void* dy, const void* w, const ConvGeometry& g);
void conv2d_backward_filter(const WorkerHandles& h, void* dw, void* db, const void* x, const void* dy,
                            const ConvGeometry& g);
void avg_pool2d_forward(const WorkerHandles& h, DType t, void* y, const void* x, const PoolGeometry& g);
void avg_pool2d_backward(const WorkerHandles& h, DType t, void* dx, const void* dy, const PoolGeometry& g);
void max_pool2d_forward(const WorkerHandles& h, DType t, void* y, const void* x, const PoolGeometry& g);
void max_pool2d_backward(const WorkerHandles& h, DType t, void* dx, const void* x, const void* dy,
                         const PoolGeometry& g);
void global_avg_pool2d_forward(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t planes,
                               std::int64_t hw);
void global_avg_pool2d_backward(const WorkerHandles& h, DType t, void* dx, const void* dy, std::int64_t planes,
                                std::int64_t hw);
// NHWC x / dx of n images, hw positions, c channels (y, dy [n, c]).
void global_avg_pool2d_forward_nhwc(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t n,
                                    std::int64_t hw, std::int64_t c);
void global_avg_pool2d_backward_nhwc(const WorkerHandles& h, DType t, void* dx, const void* dy, std::int64_t n,
                                     std::int64_t hw, std::int64_t c);

// cuDNN's spatial batch normalization (the same conventions as the CPU
// kernels; BatchNormGeometry::nhwc picks NHWC descriptors): x, y, dx, dy of dtype t; gamma, beta, the saved and running
// statistics and their gradients float32.
void batch_norm_forward_train(const WorkerHandles& h, DType t, void* y, float* save_mean, float* save_invstd,
                              float* running_mean, float* running_var, const void* x, const float* gamma,
                              const float* beta, const BatchNormGeometry& g, float eps, float momentum);
void batch_norm_forward_infer(const WorkerHandles& h, DType t, void* y, const void* x, const float* gamma,
                              const float* beta, const float* running_mean, const float* running_var,
                              const BatchNormGeometry& g, float eps);
void batch_norm_backward(const WorkerHandles& h, DType t, void* dx, float* dgamma, float* dbeta, const void* x,
                         const void* dy, const float* gamma, const float* save_mean, const float* save_invstd,
                         const BatchNormGeometry& g, float eps);

// logits and dlogits of dtype t, computed in float32; loss and labels
// float32. Labels out of range make the loss NaN on the GPU (checked on the
// host would need a synchronize); the op layer validates labels it creates
// from host data.
void softmax_cross_entropy(const WorkerHandles& h, DType t, float* loss, void* dlogits, const void* logits,
                           const float* labels, std::int64_t rows, std::int64_t cols);

// Transformer kernels (transformer.cu): x, y, dx, dy of dtype t; layer
// norm's weight, bias, mean, rstd, dweight, dbias float32. One warp per row
// (float32 arithmetic); dweight / dbias one thread per column summing the
// rows in order (deterministic).
void gelu(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t n);
void gelu_grad(const WorkerHandles& h, DType t, void* dx, const void* x, const void* dy, std::int64_t n);
void softmax_rows(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t rows, std::int64_t cols);
void softmax_rows_backward(const WorkerHandles& h, DType t, void* dx, const void* y, const void* dy,
                           std::int64_t rows, std::int64_t cols);
void layer_norm_forward(const WorkerHandles& h, DType t, void* y, float* mean, float* rstd, const void* x,
                        const float* weight, const float* bias, std::int64_t rows, std::int64_t cols, float eps);
void layer_norm_backward(const WorkerHandles& h, DType t, void* dx, float* dweight, float* dbias, const void* x,
                         const void* dy, const float* weight, const float* mean, const float* rstd, std::int64_t rows,
                         std::int64_t cols);

// Embedding (transformer.cu): weight and y of dtype t, ids float32; an id
// outside [0, vocab) gives a NaN row (the CPU kernel's check cannot reach
// the host from here). dweight float32 [vocab, width]: one thread per column
// adding the ids' rows in order when `deterministic`, else atomics.
void embedding_forward(const WorkerHandles& h, DType t, void* y, const void* weight, const float* ids, std::int64_t n,
                       std::int64_t vocab, std::int64_t width);
void embedding_backward(const WorkerHandles& h, DType t, bool deterministic, float* dweight, const float* ids,
                        const void* dy, std::int64_t n, std::int64_t vocab, std::int64_t width);

// Causal attention (attention.cu; docs/design/attention.md): q, k, v, out,
// dout, dq, dk, dv [planes, t, d] of dtype t (dt), lse [planes, t] float32.
// Batched GEMMs (cuBLAS strided batched, over row chunks of the causal
// triangle) and one warp-per-row kernel. `scores` is the caller's device
// memory of planes * t * t floats (forward) or twice that (backward),
// written and read on h.stream only.
void causal_attention_forward(const WorkerHandles& h, DType dt, void* out, float* lse, const void* q, const void* k,
                              const void* v, std::int64_t planes, std::int64_t t, std::int64_t d, float scale,
                              float* scores);
void causal_attention_backward(const WorkerHandles& h, DType dt, void* dq, void* dk, void* dv, const void* q,
                               const void* k, const void* v, const void* out, const void* dout, const float* lse,
                               std::int64_t planes, std::int64_t t, std::int64_t d, float scale, float* scores);

// Causal attention's fused path (cudnn_attention.cpp; docs/design/attention.md,
// "Fused path"): cuDNN's scaled-dot-product attention graph for bfloat16 and
// float16. WEFT_ATTENTION_IMPL picks auto (fused where cuDNN builds a plan,
// else the GEMM path), fused (a weft::Error naming the op, shape, dtype and
// cuDNN's refusal when it cannot) or gemm.
inline constexpr const char* kAttentionImplVariable = "WEFT_ATTENTION_IMPL";
inline constexpr std::int64_t kFusedAttentionMaxHeadWidth = 128;
enum class AttentionImpl { automatic, fused, gemm };
AttentionImpl attention_impl_from_env();
// Why the fused path cannot take (dtype, head width d); empty when it may.
std::string fused_attention_unsupported(DType dt, std::int64_t d);
// A finalized plan and the device memory it needs (cuDNN's workspace, then
// backward's float32 row sums and dq accumulator).
struct FusedAttention {
  std::shared_ptr<void> plan;
  std::size_t cudnn_workspace = 0;
  std::size_t workspace_bytes = 0;
};
// The cached plan for the key, built on first use; empty when the GEMM path
// is to run (impl gemm, or auto and cuDNN refused, remembered per key).
// `aligned`: every tensor's address is a multiple of 16 bytes (the graph's
// tensors promise cuDNN that alignment; a view at an odd offset takes the
// GEMM path, or is the error under fused).
std::optional<FusedAttention> fused_attention_plan(const WorkerHandles& h, DType dt, bool backward, std::int64_t b,
                                                   std::int64_t heads, std::int64_t t, std::int64_t d, float scale,
                                                   AttentionImpl impl, bool aligned);
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}
void causal_attention_fused_forward(const WorkerHandles& h, const FusedAttention& f, void* out, float* lse,
                                    const void* q, const void* k, const void* v, float scale, void* workspace);
void causal_attention_fused_backward(const WorkerHandles& h, const FusedAttention& f, void* dq, void* dk, void* dv,
                                     const void* q, const void* k, const void* v, const void* out, const void* dout,
                                     const float* lse, std::int64_t b, std::int64_t heads, std::int64_t t,
                                     float scale, void* workspace);

// w -= lr * (g + weight_decay * w), all float32; skipped entirely (w
// unchanged) when `skip` is not null and *skip != 0 (read on the device).
void sgd_update(const WorkerHandles& h, float* w, const float* g, std::int64_t n, float lr, float weight_decay,
                const float* skip);

// Dynamic loss scaling (float32 throughout, device-resident state):
// x *= 1 / *scale in place, and *found_inf = 1 when any x is Inf or NaN
// (never cleared here: the op layer zeroes it first).
void unscale_and_check(const WorkerHandles& h, float* x, std::int64_t n, const float* scale, float* found_inf);
// GradScaler's rule on one thread: *found_inf != 0 -> *scale *= backoff,
// *growth_tracker = 0, *skipped += 1; else ++*growth_tracker and, when it
// reaches `interval`, *scale *= growth and *growth_tracker = 0.
void update_loss_scale(const WorkerHandles& h, float* scale, float* growth_tracker, float* skipped,
                       const float* found_inf, float growth, float backoff, std::int64_t interval);

// ---- optimizers (optim.cu; float32, the arithmetic of ../optim_math.h, so
// the same bits as the CPU kernels) -------------------------------------------
// `tensors` is a host array: its pointers travel to the device by value in
// chunks (multi-tensor apply), then the step counters are incremented by a
// second launch, so every block of a step reads the same t. Skipped entirely
// when skip is not null and *skip != 0 (read on the device).
void optimizer_step(const WorkerHandles& h, const OptimizerHyper& hyper, const OptimizerTensor* tensors,
                    std::size_t count, const float* grad_scale, const float* skip);
// *y = sum of the squares of `count` tensors, accumulated in double through
// h.workspace, fixed partitioning (deterministic).
void sum_squares(const WorkerHandles& h, float* y, const float* const* xs, const std::int64_t* ns,
                 std::size_t count);
void clip_coefficient(const WorkerHandles& h, float* coef, const float* norm_sq, float max_norm);

}  // namespace weft::kernels::gpu
