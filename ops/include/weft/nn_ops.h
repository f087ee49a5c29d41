// The layer ops the nn building blocks push: dense, 2-D convolution, pooling,
// batch normalization, softmax cross-entropy, causal attention and SGD, forward
// and backward, and dynamic loss scaling. Layouts: NCHW activations, OIHW filters, [out, in]
// dense weights (y = x w^T + b), each 4-D tensor in either memory format
// (weft/tensor.h): convolutions, pooling and batch norm compute in their data
// input's format (x; dy for the ops without x) and give outputs in it; a
// filter or dy in the other format is converted first (ops::to_memory_format's
// op, in traces). conv2d_backward_filter gives dw in `w_format`. Data tensors are float32, bfloat16 or
// float16, one dtype per op (weft/ops.h); batch norm's per-channel tensors,
// losses, labels, SGD's weights and the loss-scaling state are float32.
// Dense and convolutions of float32 data run as TF32 under ops::AllowTf32;
// GPU convolutions choose their algorithm by Engine::conv_algo().
#pragma once

#include <cstdint>
#include <vector>

#include "weft/tensor.h"

namespace weft::ops {

struct Conv2dParams {
  std::int64_t stride = 1;
  std::int64_t pad = 0;
};

// A square window moved by `stride`, over the input padded by `pad` on every
// side (pad <= kernel / 2). Padded positions never win a max, and count as
// zeros in an average, which always divides by kernel * kernel (PyTorch's
// default, count_include_pad).
struct Pool2dParams {
  std::int64_t kernel = 2;
  std::int64_t stride = 2;
  std::int64_t pad = 0;
};

// x [N, in], w [out, in], b [out] (may be undefined) -> [N, out]
Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b);
struct DenseGrads {
  Tensor dx, dw, db;
};
DenseGrads dense_backward(const Tensor& x, const Tensor& w, const Tensor& dy);
// Its two halves as separate ops, same values: dx = dy w; and dw = dy^T x,
// db = column sums of dy (both in one op).
Tensor dense_backward_data(const Tensor& dy, const Tensor& w);
struct DenseWeightGrads {
  Tensor dw, db;
};
DenseWeightGrads dense_backward_weight(const Tensor& x, const Tensor& dy);

// x [N, C, H, W], w [O, C, KH, KW], b [O] (may be undefined) -> [N, O, OH, OW]
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, Conv2dParams p = {});
Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, Conv2dParams p = {});
struct ConvFilterGrads {
  Tensor dw, db;
};
ConvFilterGrads conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Shape& w_shape, Conv2dParams p = {},
                                       MemoryFormat w_format = MemoryFormat::contiguous);

Tensor avg_pool2d(const Tensor& x, Pool2dParams p = {});
Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x_shape, Pool2dParams p = {});
Tensor max_pool2d(const Tensor& x, Pool2dParams p = {});
Tensor max_pool2d_backward(const Tensor& x, const Tensor& dy, Pool2dParams p = {});

// x [N, C, H, W] -> [N, C, 1, 1], the mean of each plane (PyTorch's
// AdaptiveAvgPool2d((1, 1))); backward spreads dy / (H * W) over the plane,
// giving dx in `x_format` (dy [N, C, 1, 1] lies alike in both).
Tensor global_avg_pool2d(const Tensor& x);
Tensor global_avg_pool2d_backward(const Tensor& dy, const Shape& x_shape,
                                  MemoryFormat x_format = MemoryFormat::contiguous);

// Batch normalization (Ioffe and Szegedy 2015) per channel of x [N, C, H, W]
// or [N, C], with gamma and beta [C]:
//   y = (x - mean) / sqrt(var + eps) * gamma + beta.
// Training mode normalizes by the batch's statistics (over N, H, W; the
// biased variance), needs at least two values per channel, and folds them
// into running_mean and running_var ([C], updated in place by the same op):
//   running = (1 - momentum) * running + momentum * batch statistic,
// with the unbiased variance for running_var (cuDNN's and PyTorch's rule).
// Inference mode normalizes by running_mean / running_var instead.
struct BatchNormParams {
  float eps = 1e-5f;
  float momentum = 0.1f;
};
struct BatchNormTrain {
  Tensor y;
  Tensor save_mean, save_invstd;  // [C]: the batch mean and 1 / sqrt(var + eps), for backward
};
BatchNormTrain batch_norm_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                                Tensor& running_var, BatchNormParams p = {});
Tensor batch_norm_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                        const Tensor& running_var, BatchNormParams p = {});
struct BatchNormGrads {
  Tensor dx, dgamma, dbeta;
};
// The gradients of a training-mode forward of x, from its saved statistics.
BatchNormGrads batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                                   const Tensor& save_invstd, BatchNormParams p = {});

// logits [N, C], labels [N] (class indices as float) -> mean loss (scalar) and
// d loss / d logits. A label out of range fails the op (on a GPU: NaN loss).
struct SoftmaxCrossEntropy {
  Tensor loss, dlogits;
};
SoftmaxCrossEntropy softmax_cross_entropy(const Tensor& logits, const Tensor& labels);

// ---- transformer ops (docs/design/transformer-ops.md) ----------------------
// Data tensors float32, bfloat16 or float16 (halves computed in float32,
// outputs rounded); layer norm's weight, bias, mean, rstd and their
// gradients float32. Softmax and layer norm work along the last dimension of
// a contiguous tensor of any rank >= 1.
// GELU, tanh form (GPT-2): y = x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor gelu(const Tensor& x);
Tensor gelu_backward(const Tensor& x, const Tensor& dy);  // dx
// y = softmax of each row along the last dimension; backward from y.
Tensor softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& y, const Tensor& dy);  // dx
// Layer normalization (Ba et al. 2016) over the last dimension (C):
// y = (x - mean) / sqrt(var + eps) * weight + bias, weight and bias [C];
// mean and rstd = 1 / sqrt(var + eps) [rows] in float32 (rows = numel / C).
struct LayerNormParams {
  float eps = 1e-5f;
};
struct LayerNormForward {
  Tensor y, mean, rstd;
};
LayerNormForward layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, LayerNormParams p = {});
struct LayerNormGrads {
  Tensor dx, dweight, dbias;
};
LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd);

// Embedding lookup: weight [vocab, width], ids (row indices as float32, any
// shape S) -> [S..., width] of weight's dtype. Backward: dweight [vocab,
// width] float32, dy's rows added into the rows ids name (deterministic on
// CPU devices and simulated GPUs; on CUDA under Engine::conv_algo()'s
// deterministic, else with atomics). An id that is not an index in
// [0, vocab) fails the op, naming ids, the index and the vocabulary (on a
// CUDA GPU: NaN rows, the gradient leaves it out).
Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor embedding_backward(const Tensor& ids, const Tensor& dy, std::int64_t vocab);
// Causal scaled dot-product attention: q, k, v [B, H, T, D] (batch, heads,
// sequence, head width; one floating dtype, one device) ->
//   out_i = sum_{j <= i} softmax_j(scale * q_i . k_j) v_j   [B, H, T, D]
// and lse [B, H, T] float32, each row's log-sum-exp of its scaled scores,
// which backward takes instead of the scores. Half inputs compute in float32.
// CPU (and simulated GPUs): blocked, FlashAttention-2's algorithm, never more
// than one tile of scores per worker. CUDA: batched GEMMs and a masked
// softmax over float32 scores the op holds while it runs, [B * H, T, T]
// (twice that for backward) from the device's allocator
// (docs/design/attention.md).
struct CausalAttention {
  Tensor out, lse;
};
CausalAttention causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, float scale);
struct CausalAttentionGrads {
  Tensor dq, dk, dv;
};
// From the forward's out and lse, and dout (out's gradient).
CausalAttentionGrads causal_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                               const Tensor& dout, const Tensor& lse, float scale);

// w -= lr * (g + weight_decay * w), in place (float32).
void sgd_update(Tensor& w, const Tensor& g, float lr, float weight_decay = 0.0f);
// As above, skipped (w unchanged) when skip ([1], float32) is not zero when
// the op runs: a loss scaler's found-inf flag decides on the device, and the
// host never waits for it.
void sgd_update(Tensor& w, const Tensor& g, float lr, float weight_decay, const Tensor& skip);

// ---- dynamic loss scaling (GradScaler's rules) -----------------------------
// One op over float32 gradients of one device: each grad *= 1 / scale, in
// place, and the returned [1] float32 flag is 1 when any of them held an Inf
// or NaN (before unscaling), else 0. scale: [1] float32 on their device.
Tensor unscale_and_check(const std::vector<Tensor>& grads, const Tensor& scale);
struct LossScaleRule {
  float growth_factor = 2.0f;          // after growth_interval clean steps in a row
  float backoff_factor = 0.5f;         // on a step with Inf or NaN (which is skipped)
  std::int64_t growth_interval = 2000;
};
// One op: found_inf != 0 -> scale *= backoff, growth_tracker = 0, skipped
// += 1; else growth_tracker += 1 and, at the interval, scale *= growth and
// growth_tracker = 0. Every tensor [1] float32 on one device.
void update_loss_scale(Tensor& scale, Tensor& growth_tracker, Tensor& skipped, const Tensor& found_inf,
                       const LossScaleRule& rule = {});

}  // namespace weft::ops
