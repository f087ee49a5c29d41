// The layer ops the nn building blocks push: dense, 2-D convolution, pooling,
// softmax cross-entropy and SGD, forward and backward. Layouts: NCHW
// activations, OIHW filters, [out, in] dense weights (y = x w^T + b).
#pragma once

#include <cstdint>

#include "weft/tensor.h"

namespace weft::ops {

struct Conv2dParams {
  std::int64_t stride = 1;
  std::int64_t pad = 0;
};

struct Pool2dParams {
  std::int64_t kernel = 2;
  std::int64_t stride = 2;
};

// x [N, in], w [out, in], b [out] (may be undefined) -> [N, out]
Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b);
struct DenseGrads {
  Tensor dx, dw, db;
};
DenseGrads dense_backward(const Tensor& x, const Tensor& w, const Tensor& dy);

// x [N, C, H, W], w [O, C, KH, KW], b [O] (may be undefined) -> [N, O, OH, OW]
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, Conv2dParams p = {});
Tensor conv2d_backward_data(const Tensor& dy, const Tensor& w, const Shape& x_shape, Conv2dParams p = {});
struct ConvFilterGrads {
  Tensor dw, db;
};
ConvFilterGrads conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Shape& w_shape, Conv2dParams p = {});

Tensor avg_pool2d(const Tensor& x, Pool2dParams p = {});
Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x_shape, Pool2dParams p = {});
Tensor max_pool2d(const Tensor& x, Pool2dParams p = {});
Tensor max_pool2d_backward(const Tensor& x, const Tensor& dy, Pool2dParams p = {});

// logits [N, C], labels [N] (class indices as float) -> mean loss (scalar) and
// d loss / d logits. A label out of range fails the op (on a GPU: NaN loss).
struct SoftmaxCrossEntropy {
  Tensor loss, dlogits;
};
SoftmaxCrossEntropy softmax_cross_entropy(const Tensor& logits, const Tensor& labels);

// w -= lr * (g + weight_decay * w), in place.
void sgd_update(Tensor& w, const Tensor& g, float lr, float weight_decay = 0.0f);

}  // namespace weft::ops
