// Shared by the DataParallel tests on CPU devices, simulated GPUs and
// MPI ranks (test_data_parallel*.cpp, pipeline/): random batches, the one-device
// reference run, a DataParallel run of the same batches, and the comparison.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "weft/engine.h"
#include "weft/nn.h"
#include "weft/nn_ops.h"
#include "weft/parallel/data_parallel.h"
#include "weft/tensor.h"

namespace dp_test {

using weft::Device;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
namespace nn = weft::nn;
namespace par = weft::parallel;

// Builds the model on a device from a seed (which varies per replica, so
// that only the initial broadcast makes replicas equal).
// cpu(0), ..., cpu(n - 1).
inline std::vector<Device> cpus(int n) {
  std::vector<Device> out;
  for (int i = 0; i < n; ++i) out.push_back(Device::cpu(i));
  return out;
}

using ModelFn = std::function<std::unique_ptr<nn::Sequential>(Engine&, Device, std::uint64_t seed)>;

inline ModelFn lenet_model() {
  return [](Engine& e, Device d, std::uint64_t seed) { return nn::lenet(e, d, seed); };
}
inline ModelFn mlp_model() {
  return [](Engine& e, Device d, std::uint64_t seed) { return nn::mlp(e, {20, 32, 16, 5}, d, seed); };
}

struct Batch {
  Shape x_shape;
  std::vector<float> x, y;  // y: class indices as float
};

// `rows` examples of shape `example` with labels below `classes`.
inline Batch random_batch(std::int64_t rows, const std::vector<std::int64_t>& example, int classes, std::uint64_t seed) {
  std::vector<std::int64_t> dims{rows};
  dims.insert(dims.end(), example.begin(), example.end());
  Batch b{Shape(dims), {}, {}};
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  b.x.resize(static_cast<std::size_t>(b.x_shape.numel()));
  for (float& v : b.x) v = static_cast<float>(next() % 2001) / 1000.0f - 1.0f;
  for (std::int64_t i = 0; i < rows; ++i) b.y.push_back(static_cast<float>(next() % static_cast<std::uint64_t>(classes)));
  return b;
}

inline std::vector<Batch> lenet_batches(int steps, std::int64_t rows, std::uint64_t seed = 1) {
  std::vector<Batch> out;
  for (int i = 0; i < steps; ++i) out.push_back(random_batch(rows, {1, 28, 28}, 10, seed + static_cast<std::uint64_t>(i)));
  return out;
}
inline std::vector<Batch> mlp_batches(int steps, std::int64_t rows, std::uint64_t seed = 1) {
  std::vector<Batch> out;
  for (int i = 0; i < steps; ++i) out.push_back(random_batch(rows, {20}, 5, seed + static_cast<std::uint64_t>(i)));
  return out;
}

inline std::vector<std::vector<float>> values_of(nn::Sequential& net) {
  std::vector<std::vector<float>> out;
  for (nn::Parameter* p : net.parameters()) out.push_back(p->value.to_host());
  return out;
}

// One model (seed 0) on `device`, a plain SGD step per batch on all of it.
// With `accumulate`, the gradients of all batches are summed and one step
// taken at the end (what no_sync over those batches does).
inline std::vector<std::vector<float>> reference_run(Engine& e, const ModelFn& make, const std::vector<Batch>& batches,
                                                     float lr, Device device = Device::cpu(0),
                                                     bool accumulate = false) {
  auto net = make(e, device, 0);
  const std::vector<nn::Parameter*> params = net->parameters();
  std::vector<Tensor> sums;
  for (const Batch& b : batches) {
    Tensor x = Tensor::from_host(e, b.x_shape, b.x, device);
    Tensor y = Tensor::from_host(e, Shape{b.x_shape[0]}, b.y, device);
    net->backward(weft::ops::softmax_cross_entropy(net->forward(x), y).dlogits);
    if (!accumulate) {
      nn::sgd_step(params, lr);
      continue;
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (sums.size() <= i) {
        sums.push_back(Tensor::zeros(e, params[i]->value.shape(), device));
      }
      weft::ops::axpy(1.0f, params[i]->grad, sums[i]);
    }
  }
  if (accumulate)
    for (std::size_t i = 0; i < params.size(); ++i) weft::ops::sgd_update(params[i]->value, sums[i], lr);
  return values_of(*net);
}

// The same batches through a DataParallel of `make` (each replica seeded with
// its device's index: only the broadcast makes them start equal). Each batch is one step; with
// `no_sync_every` k > 1, k batches make one step (the first k - 1 inside
// no_sync). `setup`, if given, is called on the trainer before the first
// batch (set_reduction, say). Returns the trainer for inspection.
inline std::unique_ptr<par::DataParallel> data_parallel_run(Engine& e, const ModelFn& make, std::vector<Device> devices,
                                                            const std::vector<Batch>& batches, float lr,
                                                            par::DataParallelOptions options = {},
                                                            int no_sync_every = 1,
                                                            const std::function<void(par::DataParallel&)>& setup = {}) {
  auto dp = std::make_unique<par::DataParallel>(
      e, std::move(devices), [&](Device d) { return make(e, d, static_cast<std::uint64_t>(d.index())); },
      std::move(options));
  if (setup) setup(*dp);
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    std::vector<Tensor> x = dp->split_and_load(b.x_shape, b.x);
    std::vector<Tensor> y = dp->split_and_load(Shape{b.x_shape[0]}, b.y);
    std::vector<Tensor> logits = dp->forward(x);
    std::vector<Tensor> dlogits;
    for (std::size_t r = 0; r < logits.size(); ++r)
      dlogits.push_back(weft::ops::softmax_cross_entropy(logits[r], y[r]).dlogits);
    const bool last_of_group = (i + 1) % static_cast<std::size_t>(no_sync_every) == 0;
    if (last_of_group) {
      dp->backward(dlogits);
      dp->step(lr);
    } else {
      auto guard = dp->no_sync();
      dp->backward(dlogits);
    }
  }
  return dp;
}

// One optimizer step per batch through `dp` (its own optimizer and learning
// rate): forward, softmax cross-entropy, backward, step.
inline void train_steps(par::DataParallel& dp, const std::vector<Batch>& batches) {
  for (const Batch& b : batches) {
    std::vector<Tensor> x = dp.split_and_load(b.x_shape, b.x);
    std::vector<Tensor> y = dp.split_and_load(Shape{b.x_shape[0]}, b.y);
    std::vector<Tensor> logits = dp.forward(x);
    std::vector<Tensor> dlogits;
    for (std::size_t r = 0; r < logits.size(); ++r)
      dlogits.push_back(weft::ops::softmax_cross_entropy(logits[r], y[r]).dlogits);
    dp.backward(dlogits);
    dp.step();
  }
}

// Every value within tol * max(1, |want|).
inline void expect_close(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                         double tol, const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(got[i].size() == want[i].size());
    for (std::size_t j = 0; j < got[i].size(); ++j) {
      const double w = want[i][j];
      worst = std::max(worst, std::abs(static_cast<double>(got[i][j]) - w) / std::max(1.0, std::abs(w)));
    }
  }
  CHECK_MESSAGE(worst <= tol, what << ": largest relative difference " << worst);
}

}  // namespace dp_test
