// Shared by the loss-scaling tests on CPU devices and across MPI ranks: one
// DataParallel step whose gradients hold a planted Inf on one replica only.
#pragma once

#include <limits>
#include <vector>

#include "data_parallel/data_parallel_util.h"
#include "weft/ops.h"

namespace dp_test {

// Forward and backward of `b` through dp; then, when `plant` is true, replica
// `replica`'s first gradient gets an Inf added (after the reduction: only
// that replica holds it, as one holding a shard would); then step().
inline void step_with_planted_inf(par::DataParallel& dp, const Batch& b, float lr, bool plant, int replica = 0) {
  std::vector<Tensor> x = dp.split_and_load(b.x_shape, b.x);
  std::vector<Tensor> y = dp.split_and_load(Shape{b.x_shape[0]}, b.y);
  std::vector<Tensor> logits = dp.forward(x);
  std::vector<Tensor> dlogits;
  for (std::size_t r = 0; r < logits.size(); ++r)
    dlogits.push_back(weft::ops::softmax_cross_entropy(logits[r], y[r]).dlogits);
  dp.backward(dlogits);
  if (plant) {
    nn::Parameter* p = dp.replica(replica).parameters().front();
    p->grad = weft::ops::add_scalar(p->grad, std::numeric_limits<float>::infinity());
  }
  dp.step(lr);
}

}  // namespace dp_test
