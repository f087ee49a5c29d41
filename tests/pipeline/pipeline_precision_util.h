// Shared by the pipeline precision tests in one process and across MPI
// ranks: the unpipelined model trained on one device in a precision, with
// or without dynamic loss scaling (written out with the ops, apart from
// Pipeline's own scaler), and a batch that puts an Inf into the first
// layer's weight gradient only.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "data_parallel/data_parallel_util.h"
#include "weft/nn.h"
#include "weft/nn_ops.h"
#include "weft/ops.h"
#include "weft/parallel/pipeline.h"
#include "weft/precision.h"
#include "weft/tensor.h"

namespace pipe_precision {

using dp_test::Batch;
using weft::Device;
using weft::DType;
using weft::Engine;
using weft::Precision;
using weft::Shape;
using weft::Tensor;
namespace nn = weft::nn;
namespace ops = weft::ops;
namespace par = weft::parallel;

struct Trained {
  std::unique_ptr<nn::Sequential> net;
  std::vector<float> losses;
  float scale = 1;          // the loss scale after the last step
  std::int64_t skipped = 0;  // steps skipped
};

// `batches` SGD steps at `lr` of `make`'s model on cpu(0) in `precision`:
// the loss on float32 logits, its gradient times the scale (with
// `scaling`), the gradients unscaled and checked, the update skipped on an
// Inf or NaN and the scale moved by GradScaler's rules.
inline Trained train_one_device(Engine& e, const dp_test::ModelFn& make, const std::vector<Batch>& batches,
                                Precision precision, const std::optional<par::LossScaling>& scaling, float lr) {
  Trained t{make(e, Device::cpu(0), 0), {}, 1, 0};
  t.net->set_precision(precision);
  Tensor scale, growth, skipped;
  if (scaling) {
    scale = Tensor::full(e, Shape{1}, scaling->init_scale);
    growth = Tensor::zeros(e, Shape{1});
    skipped = Tensor::zeros(e, Shape{1});
  }
  for (const Batch& b : batches) {
    const Tensor x = Tensor::from_host(e, b.x_shape, b.x);
    const Tensor y = Tensor::from_host(e, Shape{b.x_shape[0]}, b.y);
    const Tensor out = t.net->forward(x);
    const auto sce = ops::softmax_cross_entropy(out.dtype() == DType::float32 ? out : ops::cast(out, DType::float32), y);
    Tensor g = scaling ? ops::scale_by(sce.dlogits, scale) : sce.dlogits;
    t.net->backward(g.dtype() == out.dtype() ? g : ops::cast(g, out.dtype()));
    t.losses.push_back(sce.loss.item());
    if (!scaling) {
      nn::sgd_step(t.net->parameters(), lr);
      continue;
    }
    std::vector<Tensor> grads;
    for (nn::Parameter* p : t.net->parameters()) grads.push_back(p->grad);
    const Tensor found = ops::unscale_and_check(grads, scale);
    nn::sgd_step(t.net->parameters(), lr, 0.0f, found);
    ops::update_loss_scale(scale, growth, skipped, found, scaling->rule);
  }
  if (scaling) {
    t.scale = scale.item();
    t.skipped = static_cast<std::int64_t>(skipped.item());
  }
  return t;
}

// A batch of the MLP (20 features) whose feature 0 is `huge` in every row:
// with the first layer's weights of that feature zero the forward does not
// see it, but that layer's weight gradient (dy^T x, times the loss scale)
// overflows to Inf, and only there.
inline Batch overflowing_batch(std::int64_t rows, float huge = 3.0e38f) {
  Batch b = dp_test::random_batch(rows, {20}, 5, 99);
  for (std::int64_t r = 0; r < rows; ++r) b.x[static_cast<std::size_t>(r * 20)] = huge;
  return b;
}
// Zeroes column 0 of the first Dense layer's weight (first parameter of layer 0).
inline void zero_first_column(nn::Sequential& net) {
  nn::Parameter& w = *net[0].parameters().front();
  std::vector<float> v = w.value.to_host();
  const std::int64_t in = w.value.shape()[1];
  for (std::size_t i = 0; i < v.size(); i += static_cast<std::size_t>(in)) v[i] = 0.0f;
  w.value.copy_from(Tensor::from_host(w.value.engine(), w.value.shape(), v, w.value.device()));
}

}  // namespace pipe_precision
