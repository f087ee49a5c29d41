// Helpers for the nn layer tests: random inputs, and the gradient check that
// compares a layer's backward (input and parameter gradients) with central
// finite differences of L(x, params) = sum(forward(x) * r).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "weft/engine.h"
#include "weft/nn.h"
#include "weft/tensor.h"

namespace weft_test::layers {

namespace nn = weft::nn;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
using i64 = std::int64_t;

inline std::unique_ptr<Engine> naive_engine() { return Engine::create(weft::EngineConfig{.kind = "naive"}); }

// Same bits (NaN included), which operator== on floats would not say.
inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline std::vector<float> random_vec(i64 n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// Values in [-1, -margin] u [margin, 1]: no ReLU kink within a step < margin.
inline std::vector<float> away_from_zero(i64 n, std::uint64_t seed, float margin) {
  std::vector<float> v = random_vec(n, seed, margin, 1.0f);
  std::mt19937_64 gen(seed ^ 0x5555);
  for (float& x : v)
    if (gen() & 1) x = -x;
  return v;
}

// A shuffled ramp: every pair of values differs by at least `gap`, so no
// max-pool window has a near tie.
inline std::vector<float> distinct_values(i64 n, std::uint64_t seed, float gap) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (i64 i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(i - n / 2) * gap;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

struct GradCheckOptions {
  double step = 1e-2;
  double atol = 2e-3;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-2;
  // Elements where the differences with step and step/2 disagree straddle a
  // kink (ReLU, max pool); they are skipped, at most this fraction of them.
  double max_skipped = 0.0;
  // Take the differences through the training-mode forward (batch norm:
  // batch statistics) instead of the evaluation one.
  bool numeric_in_training = false;
};

// Compares layer.backward(r) with central differences of
// L(x, params) = sum(layer.forward(x) * r), for every element of x and of
// every parameter. Returns the first mismatch (empty when all agree).
inline std::string gradient_mismatch(Engine& engine, nn::Layer& layer, const Shape& x_shape, std::vector<float> x,
                              std::uint64_t seed, GradCheckOptions opt = {}) {
  layer.train(true);
  const Tensor xt = Tensor::from_host(engine, x_shape, x);
  const Tensor y = layer.forward(xt);
  REQUIRE(y.shape() == layer.output_shape(x_shape));
  const std::vector<float> r = random_vec(y.numel(), seed ^ 0xabcdef);
  const Tensor dx = layer.backward(Tensor::from_host(engine, y.shape(), r));
  REQUIRE(dx.shape() == x_shape);
  const std::vector<float> dx_host = dx.to_host();
  std::vector<nn::Parameter*> params = layer.parameters();
  std::vector<std::vector<float>> grads;
  for (nn::Parameter* p : params) {
    REQUIRE_MESSAGE(p->grad.defined(), p->name);
    REQUIRE(p->grad.shape() == p->value.shape());
    grads.push_back(p->grad.to_host());
  }

  layer.train(opt.numeric_in_training);
  auto loss = [&](const std::vector<float>& xv) {
    return dot(layer.forward(Tensor::from_host(engine, x_shape, xv)).to_host(), r);
  };
  i64 checked = 0, skipped = 0;
  std::string mismatch;
  // d L / d v[i] numerically, where set(v) installs v and returns L.
  auto check = [&](const std::string& what, std::vector<float> v, const std::vector<float>& analytic, auto&& eval) {
    REQUIRE(v.size() == analytic.size());
    for (std::size_t i = 0; i < v.size() && mismatch.empty(); ++i) {
      const float orig = v[i];
      auto diff = [&](double h) {
        v[i] = static_cast<float>(orig + h);
        const double hp = static_cast<double>(v[i]) - orig;  // the step float32 actually took
        const double lp = eval(v);
        v[i] = static_cast<float>(orig - h);
        const double hm = orig - static_cast<double>(v[i]);
        const double lm = eval(v);
        v[i] = orig;
        return (lp - lm) / (hp + hm);
      };
      const double num = diff(opt.step);
      const double num_half = diff(opt.step / 2);
      ++checked;
      if (std::abs(num - num_half) > opt.atol + opt.rtol * std::abs(num)) {
        ++skipped;  // a kink between the two steps
        continue;
      }
      const double a = analytic[i];
      if (!(std::abs(a - num) <= opt.atol + opt.rtol * std::abs(num))) {
        std::ostringstream os;
        os << what << "[" << i << "]: backward gives " << a << ", finite differences " << num << " (step "
           << opt.step << ")";
        mismatch = os.str();
      }
    }
    eval(v);  // reinstate the original values
  };

  check("dx", x, dx_host, [&](const std::vector<float>& xv) { return loss(xv); });
  for (std::size_t k = 0; k < params.size(); ++k) {
    nn::Parameter& p = *params[k];
    check("d " + p.name, p.value.to_host(), grads[k], [&](const std::vector<float>& pv) {
      p.value.copy_from(Tensor::from_host(engine, p.value.shape(), pv));
      return loss(x);
    });
  }
  layer.train(true);
  if (mismatch.empty() && static_cast<double>(skipped) > opt.max_skipped * static_cast<double>(checked))
    mismatch = std::to_string(skipped) + " of " + std::to_string(checked) + " elements skipped at kinks";
  return mismatch;
}

inline void check_gradients(Engine& engine, nn::Layer& layer, const Shape& x_shape, std::vector<float> x,
                     std::uint64_t seed, GradCheckOptions opt = {}) {
  const std::string mismatch = gradient_mismatch(engine, layer, x_shape, std::move(x), seed, opt);
  CHECK_MESSAGE(mismatch.empty(), layer.describe() << ", input " << x_shape.str() << ": " << mismatch);
}

}  // namespace weft_test::layers
