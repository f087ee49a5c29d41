// CPU kernels on raw float32 buffers (row-major, contiguous). The op layer
// checks shapes and devices at push time and calls these from an engine
// worker; each kernel parallelizes inside itself with oneTBB (through
// intra_op_arena(), so ops running on several engine workers never put more
// busy threads on the machine than it has), and never reads out of bounds
// for the sizes it is given. Sizes may be 0.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../conv_geometry.h"
#include "../optim_math.h"
#include "weft/dtype.h"

namespace weft::kernels::cpu {

// ---- creation -------------------------------------------------------------
void fill(float* y, std::int64_t n, float value);
// Counter-based (seed, index) generators: the same values on every device and
// for every split of the work (see ../random.h).
void uniform(float* y, std::int64_t n, float lo, float hi, std::uint64_t seed);
void normal(float* y, std::int64_t n, float mean, float stddev, std::uint64_t seed);
void copy(float* y, const float* x, std::int64_t n);
// y (yt) = x (xt) converted (weft/dtype.h's rounding); float32, bfloat16 or
// float16 each (else a weft::Error).
void cast(void* y, DType yt, const void* x, DType xt, std::int64_t n);
// Memory formats (layout.cpp): y = x of n images, c channels and hw
// positions, elements of `elem` bytes, NCHW -> NHWC and NHWC -> NCHW.
void to_channels_last(void* y, const void* x, std::int64_t n, std::int64_t c, std::int64_t hw, std::size_t elem);
void to_channels_first(void* y, const void* x, std::int64_t n, std::int64_t c, std::int64_t hw, std::size_t elem);
// Axis permutation (layout.cpp): y, contiguous of `rank` (1..6) axes of
// extents extent[0..rank), takes at its element (i0, .., i{rank-1}) x's
// element at sum(i[a] * src_stride[a]) (strides in elements); elements of
// `elem` bytes. When src_stride[rank-1] == 1 each run of the last extent is
// one memcpy.
void permute(void* y, const void* x, int rank, const std::int64_t* extent, const std::int64_t* src_stride,
             std::size_t elem);
// y = x with each mantissa rounded to TF32's 10 bits (y may be x).
void round_to_tf32(float* y, const float* x, std::int64_t n);

// ---- elementwise ----------------------------------------------------------
void add(float* y, const float* a, const float* b, std::int64_t n);
void sub(float* y, const float* a, const float* b, std::int64_t n);
void mul(float* y, const float* a, const float* b, std::int64_t n);
void maximum(float* y, const float* a, const float* b, std::int64_t n);
void add_scalar(float* y, const float* x, float s, std::int64_t n);
void mul_scalar(float* y, const float* x, float s, std::int64_t n);
void axpy(float* y, float alpha, const float* x, std::int64_t n);  // y += alpha * x
void relu(float* y, const float* x, std::int64_t n);
void relu_grad(float* dx, const float* x, const float* dy, std::int64_t n);  // dy where x > 0, else 0

// ---- reductions -----------------------------------------------------------
void sum(float* y, const float* x, std::int64_t n);  // *y = sum, accumulated in double
// Index of the largest element of each row of a rows x cols matrix, as float;
// ties go to the lowest index.
void argmax_rows(float* y, const float* x, std::int64_t rows, std::int64_t cols);

// ---- BLAS -----------------------------------------------------------------
// C[m x n] = alpha * op(A) * op(B) + beta * C, row-major; op(A) is m x k.
// lda/ldb/ldc are the row strides of A, B, C as stored.
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

// `batch` gemms at once: matrix i of A, B, C starts stride_a / stride_b /
// stride_c elements after matrix i - 1 (blas.cpp).
void gemm_batched(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const float* a, std::int64_t lda, std::int64_t stride_a, const float* b,
                  std::int64_t ldb, std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                  std::int64_t stride_c);

// ---- layers ---------------------------------------------------------------
// y[N, out] = x[N, in] * w[out, in]^T + b[out]   (b may be null)
void dense_forward(float* y, const float* x, const float* w, const float* b, std::int64_t batch, std::int64_t in,
                   std::int64_t out);
// dx[N, in] = dy * w;  dw[out, in] = dy^T * x;  db[out] = column sums of dy.
// Any of dx, dw, db may be null (not wanted).
void dense_backward(float* dx, float* dw, float* db, const float* x, const float* w, const float* dy,
                    std::int64_t batch, std::int64_t in, std::int64_t out);

// y[N, O, OH, OW] = conv(x[N, C, H, W], w[O, C, KH, KW]) + b[O]  (b may be null);
// with g.nhwc, x, y, dx, dy NHWC and w, dw OHWI (the *_nhwc kernels,
// conv_nhwc.cpp, which these call then).
void conv2d_forward(float* y, const float* x, const float* w, const float* b, const ConvGeometry& g);
// dx = gradient with respect to the input, given dy and w.
void conv2d_backward_data(float* dx, const float* dy, const float* w, const ConvGeometry& g);
// dw (and db when not null) = gradient with respect to the filter and bias.
void conv2d_backward_filter(float* dw, float* db, const float* x, const float* dy, const ConvGeometry& g);
void conv2d_forward_nhwc(float* y, const float* x, const float* w, const float* b, const ConvGeometry& g);
void conv2d_backward_data_nhwc(float* dx, const float* dy, const float* w, const ConvGeometry& g);
void conv2d_backward_filter_nhwc(float* dw, float* db, const float* x, const float* dy, const ConvGeometry& g);

// Pooling windows are clipped to the input (PoolGeometry: padded positions
// never win a max; an average divides by kernel^2 all the same).
void avg_pool2d_forward(float* y, const float* x, const PoolGeometry& g);
void avg_pool2d_backward(float* dx, const float* dy, const PoolGeometry& g);  // overwrites dx
void max_pool2d_forward(float* y, const float* x, const PoolGeometry& g);
// Routes dy to the first maximum of each window (the one forward picked).
void max_pool2d_backward(float* dx, const float* x, const float* dy, const PoolGeometry& g);  // overwrites dx
// y[p] = mean of plane p's hw values (planes = N * C); backward spreads
// dy[p] / hw over the plane (overwrites dx).
void global_avg_pool2d_forward(float* y, const float* x, std::int64_t planes, std::int64_t hw);
void global_avg_pool2d_backward(float* dx, const float* dy, std::int64_t planes, std::int64_t hw);
// The same on NHWC x / dx of n images, hw positions, c channels (y, dy [n, c]).
void global_avg_pool2d_forward_nhwc(float* y, const float* x, std::int64_t n, std::int64_t hw, std::int64_t c);
void global_avg_pool2d_backward_nhwc(float* dx, const float* dy, std::int64_t n, std::int64_t hw, std::int64_t c);

// Batch normalization, per channel of x [N, C, HW] (or [N, HW, C] with
// g.nhwc; BatchNormGeometry).
// Training: normalizes by the batch's mean and biased variance, writes them
// as save_mean and save_invstd = 1 / sqrt(var + eps), and folds the mean and
// the unbiased variance into running_mean / running_var with `momentum`
// (running = (1 - momentum) * running + momentum * batch). Needs N * HW >= 2.
void batch_norm_forward_train(float* y, float* save_mean, float* save_invstd, float* running_mean,
                              float* running_var, const float* x, const float* gamma, const float* beta,
                              const BatchNormGeometry& g, float eps, float momentum);
// Inference: normalizes by running_mean / running_var.
void batch_norm_forward_infer(float* y, const float* x, const float* gamma, const float* beta,
                              const float* running_mean, const float* running_var, const BatchNormGeometry& g,
                              float eps);
// Gradients of a training-mode forward, from its saved statistics.
void batch_norm_backward(float* dx, float* dgamma, float* dbeta, const float* x, const float* dy, const float* gamma,
                         const float* save_mean, const float* save_invstd, const BatchNormGeometry& g);

// Mean softmax cross-entropy over a batch of `rows` logits rows (`cols`
// classes); labels hold class indices as floats. Writes the mean loss to
// *loss and, when dlogits is not null, (softmax - onehot) / rows.
// A label outside [0, cols) is a weft::Error naming the row and the label.
void softmax_cross_entropy(float* loss, float* dlogits, const float* logits, const float* labels, std::int64_t rows,
                           std::int64_t cols);

// ---- transformer (transformer.cpp) --------------------------------------
// GELU, tanh form (GPT-2): y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)));
// gelu_grad gives dx = dy * dy/dx.
void gelu(float* y, const float* x, std::int64_t n);
void gelu_grad(float* dx, const float* x, const float* dy, std::int64_t n);
// Softmax of each row of a rows x cols matrix (shifted by the row max, the
// sum in double); backward from the forward's output y:
// dx = y * (dy - sum_j(dy * y)).
void softmax_rows(float* y, const float* x, std::int64_t rows, std::int64_t cols);
void softmax_rows_backward(float* dx, const float* y, const float* dy, std::int64_t rows, std::int64_t cols);
// Layer normalization of each row (cols >= 1) with per-column weight and
// bias: y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps)
// (biased variance), mean and rstd [rows] saved for backward. Backward gives
// dx, and dweight / dbias summed over the rows in row order.
void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                        std::int64_t rows, std::int64_t cols, float eps);
void layer_norm_backward(float* dx, float* dweight, float* dbias, const float* x, const float* dy, const float* weight,
                         const float* mean, const float* rstd, std::int64_t rows, std::int64_t cols);

// Embedding lookup: y[i, :] = weight[ids[i], :] for n ids (row indices as
// floats) of a [vocab, width] table; backward: dweight[v, :] = the sum of
// dy[i, :] over the i with ids[i] == v, each row summed in increasing i
// (deterministic), rows no id names zero. Both return the position of the
// first id that is not an index in [0, vocab) and then write nothing, else -1.
std::int64_t embedding_forward(float* y, const float* weight, const float* ids, std::int64_t n, std::int64_t vocab,
                               std::int64_t width);
std::int64_t embedding_backward(float* dweight, const float* ids, const float* dy, std::int64_t n, std::int64_t vocab,
                                std::int64_t width);
// Causal scaled dot-product attention over `planes` (batch x heads) planes
// of t rows of width d (q, k, v, out, dout, dq, dk, dv: [planes, t, d];
// lse: [planes, t], each row's log-sum-exp of its scaled scores). Blocked
// (attention.cpp, docs/design/attention.md): each piece of the work holds one
// kAttentionBlock x kAttentionBlock tile of scores, never t x t.
inline constexpr std::int64_t kAttentionBlock = 64;
void causal_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                              std::int64_t planes, std::int64_t t, std::int64_t d, float scale);
void causal_attention_backward(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v,
                               const float* out, const float* dout, const float* lse, std::int64_t planes,
                               std::int64_t t, std::int64_t d, float scale);
// The attention kernels' scratch: the high-water mark of the bytes all their
// pieces held at once, since the last reset (for the memory test).
std::size_t attention_scratch_peak_bytes() noexcept;
void reset_attention_scratch_peak() noexcept;

// w -= lr * (g + weight_decay * w); nothing when skip is not null and *skip != 0.
void sgd_update(float* w, const float* g, std::int64_t n, float lr, float weight_decay, const float* skip = nullptr);

// Dynamic loss scaling: x *= 1 / *scale in place, and *found_inf = 1 when
// any x is Inf or NaN (never cleared here).
void unscale_and_check(float* x, std::int64_t n, const float* scale, float* found_inf);
// GradScaler's rule: *found_inf != 0 -> *scale *= backoff, *growth_tracker =
// 0, ++*skipped; else ++*growth_tracker and, at `interval`, *scale *= growth
// and *growth_tracker = 0.
void update_loss_scale(float* scale, float* growth_tracker, float* skipped, const float* found_inf, float growth,
                       float backoff, std::int64_t interval);

// ---- optimizers (optim.cpp; the arithmetic is ../optim_math.h's) --------
// Updates each of `count` tensors with h's algorithm; the gradients are
// multiplied by *grad_scale (when not null); each step counter is read for
// the bias corrections (t = *step + 1) and then incremented. Nothing at all
// when skip is not null and *skip != 0.
void optimizer_step(const OptimizerHyper& h, const OptimizerTensor* tensors, std::size_t count,
                    const float* grad_scale, const float* skip);
// *y = the sum of the squares of `count` tensors (xs[k] of ns[k] elements),
// accumulated in double in a fixed order.
void sum_squares(float* y, const float* const* xs, const std::int64_t* ns, std::size_t count);
// *coef = min(1, max_norm / (sqrt(*norm_sq) + 1e-6)).
void clip_coefficient(float* coef, const float* norm_sq, float max_norm);

}  // namespace weft::kernels::cpu
