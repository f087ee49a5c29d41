// weft::optim on CPU devices: every algorithm (float32 arithmetic) against a
// float64 reference of PyTorch's documented formulas over 100 steps (bounds
// from float32 roundings, OptimAccuracy), and Adam's and AdamW's steps
// within float32 rounding bounds of a float64 step that a missing bias
// correction or decay would break; foreach and per-parameter steps
// bitwise equal; skip flags, gradient scales and clipping; schedules, option
// parsing and the misuse errors. Naive and threaded engines at several worker
// counts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "test_workers.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/nn.h"
#include "weft/optim.h"
#include "weft/tensor.h"

namespace nn = weft::nn;
namespace optim = weft::optim;
using weft::Device;
using weft::DType;
using weft::Engine;
using weft::EngineConfig;
using weft::Shape;
using weft::Tensor;

namespace {

const std::vector<Shape>& optim_shapes() {
  static const std::vector<Shape> shapes{Shape{7, 5}, Shape{5}, Shape{3, 4, 2}, Shape{1}, Shape{9000}};
  return shapes;
}

std::vector<float> optim_random(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Each engine kind the scenarios run on: naive, and threaded at the test
// worker counts (two CPU devices each, so parameters can be spread).
template <class F>
void optim_each_engine(F&& fn) {
  {
    INFO("naive engine");
    auto e = Engine::create(EngineConfig{.kind = "naive", .cpu_devices = 2});
    fn(*e);
  }
  for (int w : weft_test::worker_counts()) {
    if (w > 4) continue;
    INFO("threaded engine, " << w << " workers per device");
    auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 2, .workers_per_cpu_device = w});
    fn(*e);
  }
}

// A model's parameters (optim_shapes()), the k-th on cpu(device_of(k)).
struct OptimModel {
  std::vector<std::unique_ptr<nn::Parameter>> params;
  std::vector<nn::Parameter*> list() const {
    std::vector<nn::Parameter*> out;
    for (const auto& p : params) out.push_back(p.get());
    return out;
  }
};

OptimModel optim_model(Engine& e, bool two_devices, std::uint64_t seed = 1) {
  OptimModel m;
  for (std::size_t k = 0; k < optim_shapes().size(); ++k) {
    const Shape& s = optim_shapes()[k];
    const Device d = Device::cpu(two_devices ? static_cast<int>(k % 2) : 0);
    auto p = std::make_unique<nn::Parameter>();
    p->name = "layer" + std::to_string(k) + ".weight";
    p->value = Tensor::from_host(e, s, optim_random(static_cast<std::size_t>(s.numel()), seed * 100 + k), d);
    p->value.set_name(p->name);
    m.params.push_back(std::move(p));
  }
  return m;
}

// The gradient of parameter k at step t (from 0), as host data.
std::vector<float> optim_grad(std::size_t k, std::int64_t t, std::uint64_t seed = 7) {
  return optim_random(static_cast<std::size_t>(optim_shapes()[k].numel()),
                      seed * 1000003 + static_cast<std::uint64_t>(t) * 101 + k, -2.0f, 2.0f);
}

void optim_set_grads(Engine& e, OptimModel& m, std::int64_t t, float factor = 1.0f) {
  for (std::size_t k = 0; k < m.params.size(); ++k) {
    std::vector<float> g = optim_grad(k, t);
    for (float& x : g) x *= factor;
    nn::Parameter& p = *m.params[k];
    p.grad = Tensor::from_host(e, p.value.shape(), g, p.value.device());
  }
}

// PyTorch's documented update (torch.optim.SGD / Adam / AdamW) in double,
// for one parameter; the hyperparameters are the float32 options' values.
struct OptimReference {
  optim::OptimizerOptions o;
  std::vector<double> w, s0, s1;
  std::int64_t t = 0;

  OptimReference(const optim::OptimizerOptions& options, const std::vector<float>& w0)
      : o(options), w(w0.begin(), w0.end()), s0(w0.size(), 0.0), s1(w0.size(), 0.0) {}

  void step(const std::vector<float>& grad, double lr, double scale = 1.0) {
    ++t;
    const double wd = o.weight_decay, mom = o.momentum, damp = o.dampening, b1 = o.beta1, b2 = o.beta2, eps = o.eps;
    for (std::size_t i = 0; i < w.size(); ++i) {
      double g = static_cast<double>(grad[i]) * scale;
      if (o.algorithm == optim::Algorithm::sgd) {
        if (wd != 0) g += wd * w[i];
        if (mom != 0) {
          s0[i] = t == 1 ? g : mom * s0[i] + (1 - damp) * g;
          g = o.nesterov ? g + mom * s0[i] : s0[i];
        }
        w[i] -= lr * g;
        continue;
      }
      if (o.algorithm == optim::Algorithm::adamw) w[i] *= 1 - lr * wd;
      else if (wd != 0) g += wd * w[i];
      s0[i] = b1 * s0[i] + (1 - b1) * g;
      s1[i] = b2 * s1[i] + (1 - b2) * g * g;
      const double mhat = s0[i] / (1 - std::pow(b1, static_cast<double>(t)));
      const double vhat = s1[i] / (1 - std::pow(b2, static_cast<double>(t)));
      w[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

// Largest |got - want| / max(1, |want|) over the elements.
double optim_rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]) / std::max(1.0, std::abs(want[i])));
  return worst;
}

// ||got - want||_2 / max(||want||_2, sqrt(n)): the root-mean-square error
// relative to max(1, the root-mean-square value), as optim_rel_error is per
// element.
double optim_norm_error(const std::vector<float>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / std::max(norm, static_cast<double>(got.size())));
}

// The accuracy of a float32 optimizer against the float64 reference: the
// weights and states are stored in float32, so each step rounds them (half a
// unit, 3e-8 to 6e-8 of the value) and those roundings add up over the
// steps; momentum reuses its buffer's roundings for ~1 / (1 - momentum)
// steps. The kernels compute in float32 (PyTorch's fused optimizers' opmath),
// which rounds the weight once per step, except AdamW's, which rounds it
// twice (the decay, then the update), as PyTorch's does. With `roundings`
// the weight's roundings per step: each tensor within sqrt(roundings) * 1e-6
// relative in norm (optim_norm_error: independent roundings add up as a
// random walk), and every element within roundings * 3e-6 * max(1, |ref|)
// (100 steps of up to `roundings` half units each; measured worst over these
// shapes, 100 steps: 1.8e-6 for sgd with nesterov momentum, 3.4e-6 (norm
// 1.1e-6) for adamw).
struct OptimAccuracy {
  double roundings = 1;
  double norm = 0, element = 0;
  void add(const std::vector<float>& got, const std::vector<double>& want) {
    norm = std::max(norm, optim_norm_error(got, want));
    element = std::max(element, optim_rel_error(got, want));
  }
  void check() const {
    CHECK(norm <= std::sqrt(roundings) * 1e-6);
    CHECK(element <= roundings * 3e-6);
  }
};

std::vector<std::vector<float>> optim_snapshot(optim::Optimizer& opt) {
  std::vector<std::vector<float>> out;
  for (nn::Parameter* p : opt.parameters()) out.push_back(p->value.to_host());
  for (nn::Buffer* b : opt.state()) out.push_back(b->value.to_host());
  return out;
}

struct OptimCase {
  const char* what;
  optim::OptimizerOptions options;
};

std::vector<OptimCase> optim_cases() {
  optim::OptimizerOptions damped = optim::OptimizerOptions::sgd(0.02f, 0.9f, 1e-2f);
  damped.dampening = 0.1f;
  return {
      {"sgd", optim::OptimizerOptions::sgd(0.05f)},
      {"sgd with weight decay", optim::OptimizerOptions::sgd(0.05f, 0.0f, 1e-2f)},
      {"sgd momentum, dampening, weight decay", damped},
      {"sgd nesterov", optim::OptimizerOptions::sgd(0.02f, 0.9f, 1e-3f, true)},
      {"adam", optim::OptimizerOptions::adam(1e-3f)},
      {"adam with weight decay", optim::OptimizerOptions::adam(1e-3f, 1e-2f)},
      {"adamw", optim::OptimizerOptions::adamw(1e-3f, 1e-2f)},
  };
}

std::string optim_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const weft::InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

}  // namespace

TEST_CASE("optim - every algorithm matches a float64 reference of PyTorch's formulas over 100 steps" *
          doctest::timeout(120)) {
  constexpr std::int64_t kSteps = 100;
  const optim::LrSchedule schedule = optim::LrSchedule::cosine(kSteps, 10);
  optim_each_engine([&](Engine& e) {
    for (const OptimCase& c : optim_cases()) {
      for (bool scheduled : {false, true}) {
        INFO(std::string(c.what) << (scheduled ? ", cosine schedule with warm-up" : ", constant rate"));
        OptimModel m = optim_model(e, true);
        std::vector<OptimReference> refs;
        for (const auto& p : m.params) refs.emplace_back(c.options, p->value.to_host());
        optim::Optimizer opt(m.list(), c.options);
        for (std::int64_t t = 0; t < kSteps; ++t) {
          const float lr = scheduled ? schedule.lr(c.options.lr, opt.steps()) : c.options.lr;
          for (std::size_t k = 0; k < refs.size(); ++k) {
            nn::Parameter& p = *m.params[k];
            const std::vector<float> g = optim_grad(k, t);
            p.grad = Tensor::from_host(e, p.value.shape(), g, p.value.device());
            refs[k].step(g, lr);
          }
          opt.step(lr);
        }
        CHECK(opt.steps() == kSteps);
        const std::vector<nn::Buffer*> state = opt.state();
        const std::size_t per = c.options.state_names().size();
        OptimAccuracy accuracy;
        accuracy.roundings = c.options.algorithm == optim::Algorithm::adamw ? 2 : 1;
        for (std::size_t k = 0; k < refs.size(); ++k) {
          INFO("parameter " << m.params[k]->name);
          accuracy.add(m.params[k]->value.to_host(), refs[k].w);
          if (per >= 2) accuracy.add(state[k * per]->value.to_host(), refs[k].s0);
          if (per == 3) accuracy.add(state[k * per + 1]->value.to_host(), refs[k].s1);
          if (per > 0) CHECK(state[k * per + per - 1]->value.to_host() == std::vector<float>{float(kSteps)});
        }
        accuracy.check();
      }
    }
  });
}

TEST_CASE("optim - every step's update is the float64 formula applied to the stored state, within 1e-6 relative" *
          doctest::timeout(120)) {
  // The trajectory test above lets float32 storage round once per step; here
  // each of 100 steps starts the reference from the state the optimizer
  // stored, so only that step's arithmetic is compared.
  constexpr std::int64_t kSteps = 100;
  auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 2});
  for (const OptimCase& c : optim_cases()) {
    INFO(c.what);
    OptimModel m = optim_model(*e, true);
    optim::Optimizer opt(m.list(), c.options);
    const std::size_t per = c.options.state_names().size();
    double worst = 0;
    for (std::int64_t t = 0; t < kSteps; ++t) {
      const std::vector<nn::Buffer*> state = opt.state();
      std::vector<OptimReference> refs;
      for (std::size_t k = 0; k < m.params.size(); ++k) {
        nn::Parameter& p = *m.params[k];
        OptimReference ref(c.options, p.value.to_host());
        if (per >= 2) {
          const std::vector<float> s0 = state[k * per]->value.to_host();
          ref.s0.assign(s0.begin(), s0.end());
        }
        if (per == 3) {
          const std::vector<float> s1 = state[k * per + 1]->value.to_host();
          ref.s1.assign(s1.begin(), s1.end());
        }
        ref.t = t;
        const std::vector<float> g = optim_grad(k, t);
        p.grad = Tensor::from_host(*e, p.value.shape(), g, p.value.device());
        ref.step(g, c.options.lr);
        refs.push_back(std::move(ref));
      }
      opt.step();
      for (std::size_t k = 0; k < refs.size(); ++k) {
        worst = std::max(worst, optim_rel_error(m.params[k]->value.to_host(), refs[k].w));
        if (per >= 2) worst = std::max(worst, optim_rel_error(state[k * per]->value.to_host(), refs[k].s0));
        if (per == 3) worst = std::max(worst, optim_rel_error(state[k * per + 1]->value.to_host(), refs[k].s1));
      }
    }
    CHECK(worst <= 1e-6);
  }
}

TEST_CASE("optim - Adam and AdamW steps are float32 arithmetic: within float32 rounding bounds of float64, not of "
          "a wrong formula" *
          doctest::timeout(120)) {
  // Each step starts a float64 evaluation of PyTorch's formulas from the
  // stored float32 weight and states, and bounds every element by the
  // roundings float32 arithmetic makes (u = 2^-24 each, of the magnitudes the
  // operands have: Adam's L2 term makes the gradient a sum that can cancel):
  // the exp_avg blend 3 (two products, one sum; 1 - beta1 rounded once on the
  // host), exp_avg_sq 4, the weight 3 of its own magnitude (AdamW's decay factor, the decay,
  // the subtraction) and 8 of the update's magnitude (step size, bias
  // correction, sqrt, division, eps, division, product, and exp_avg's own
  // error), times 2 as margin. A missing bias correction (a factor
  // 1 / (1 - 0.9^t) on the update) or decay (1e-5 of the weight) is far
  // outside these bounds, as the checks at the end show.
  constexpr std::int64_t kSteps = 60;
  constexpr double u = 1.0 / (1 << 24);
  auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 2});
  for (const bool decoupled : {false, true}) {
    const optim::OptimizerOptions o =
        decoupled ? optim::OptimizerOptions::adamw(1e-3f, 1e-2f) : optim::OptimizerOptions::adam(1e-3f, 1e-2f);
    INFO(std::string(decoupled ? "adamw" : "adam"));
    OptimModel m = optim_model(*e, true);
    optim::Optimizer opt(m.list(), o);
    double worst = 0, worst_no_bc = 0, worst_no_decay = 0;  // error / bound
    const double b1 = o.beta1, b2 = o.beta2, eps = o.eps, lr = o.lr, wd = o.weight_decay;
    for (std::int64_t t = 0; t < kSteps; ++t) {
      const std::vector<nn::Buffer*> state = opt.state();
      std::vector<std::vector<float>> w0, m0, v0, grads;
      for (std::size_t k = 0; k < m.params.size(); ++k) {
        nn::Parameter& p = *m.params[k];
        w0.push_back(p.value.to_host());
        m0.push_back(state[k * 3]->value.to_host());
        v0.push_back(state[k * 3 + 1]->value.to_host());
        grads.push_back(optim_grad(k, t));
        p.grad = Tensor::from_host(*e, p.value.shape(), grads.back(), p.value.device());
      }
      opt.step();
      const double bc1 = 1 - std::pow(b1, static_cast<double>(t + 1));
      const double bc2 = 1 - std::pow(b2, static_cast<double>(t + 1));
      for (std::size_t k = 0; k < m.params.size(); ++k) {
        const std::vector<float> w1 = m.params[k]->value.to_host(), m1 = state[k * 3]->value.to_host(),
                                 v1 = state[k * 3 + 1]->value.to_host();
        for (std::size_t i = 0; i < w1.size(); ++i) {
          double w = w0[k][i], g = grads[k][i], g_mag = std::abs(g);  // g_mag: the magnitude g's roundings scale with
          if (decoupled) {
            w *= 1 - lr * wd;
          } else {
            g += wd * w;
            g_mag += std::abs(wd * w);
          }
          const double mm = b1 * m0[k][i] + (1 - b1) * g, m_mag = std::abs(b1 * m0[k][i]) + (1 - b1) * g_mag;
          const double vv = b2 * v0[k][i] + (1 - b2) * g * g,
                       v_mag = b2 * v0[k][i] + (1 - b2) * std::abs(g) * (std::abs(g) + 2 * g_mag);
          const double denom = std::sqrt(vv) / std::sqrt(bc2) + eps;
          const double update = lr / bc1 * mm / denom, update_mag = lr / bc1 * m_mag / denom;
          const double want = w - update;
          const double w_bound = 2 * (3 * u * std::abs(w0[k][i]) + 8 * u * update_mag);
          worst = std::max(worst, std::abs(m1[i] - mm) / (2 * 3 * u * m_mag + 1e-300));
          worst = std::max(worst, std::abs(v1[i] - vv) / (2 * 4 * u * v_mag + 1e-300));
          worst = std::max(worst, std::abs(w1[i] - want) / w_bound);
          // What a wrong formula would give, against the same bound.
          worst_no_bc = std::max(worst_no_bc, std::abs((w - lr * mm / denom) - want) / w_bound);
          if (decoupled)
            worst_no_decay = std::max(worst_no_decay, std::abs((w0[k][i] - update) - want) / w_bound);
        }
      }
    }
    CHECK(worst <= 1.0);
    CHECK(worst_no_bc > 10.0);
    if (decoupled) CHECK(worst_no_decay > 10.0);
  }
}

TEST_CASE("optim - foreach and per-parameter steps give bitwise the same weights and states" * doctest::timeout(60)) {
  optim_each_engine([&](Engine& e) {
    for (const OptimCase& c : optim_cases()) {
      INFO(std::string(c.what));
      std::vector<std::vector<std::vector<float>>> results;
      for (bool foreach : {true, false}) {
        OptimModel m = optim_model(e, true);
        optim::OptimizerOptions o = c.options;
        o.foreach = foreach;
        optim::Optimizer opt(m.list(), o);
        for (std::int64_t t = 0; t < 12; ++t) {
          optim_set_grads(e, m, t);
          opt.step(o.lr * (1.0f + 0.1f * static_cast<float>(t)));
        }
        results.push_back(optim_snapshot(opt));
      }
      CHECK(results[0] == results[1]);
    }
  });
}

TEST_CASE("optim - a skip flag leaves weights, states and step counts untouched, and later steps continue" *
          doctest::timeout(60)) {
  optim_each_engine([&](Engine& e) {
    for (const OptimCase& c : optim_cases()) {
      for (bool foreach : {true, false}) {
        INFO(std::string(c.what) << (foreach ? ", foreach" : ", per parameter"));
        optim::OptimizerOptions o = c.options;
        o.foreach = foreach;
        // Steps 0..5 with step 3 skipped, against steps 0, 1, 2, 4, 5.
        OptimModel m = optim_model(e, true), r = optim_model(e, true);
        optim::Optimizer opt(m.list(), o), ref(r.list(), o);
        const Tensor one0 = Tensor::ones(e, Shape{1}, Device::cpu(0)), one1 = Tensor::ones(e, Shape{1}, Device::cpu(1));
        const Tensor zero0 = Tensor::zeros(e, Shape{1}, Device::cpu(0)),
                     zero1 = Tensor::zeros(e, Shape{1}, Device::cpu(1));
        for (std::int64_t t = 0; t < 6; ++t) {
          optim_set_grads(e, m, t);
          if (t == 3) {
            const auto before = optim_snapshot(opt);
            opt.step(optim::StepInputs{.skip = {one0, one1}});
            CHECK(optim_snapshot(opt) == before);
            continue;
          }
          // A zero flag on one device and none on the other: both step.
          opt.step(optim::StepInputs{.skip = {t % 2 == 0 ? zero0 : zero1}});
          optim_set_grads(e, r, t);
          ref.step();
        }
        CHECK(opt.steps() == 6);
        CHECK(ref.steps() == 5);
        CHECK(optim_snapshot(opt) == optim_snapshot(ref));
        // Skipping one device only: the other's parameters step.
        optim_set_grads(e, m, 9);
        const auto before = optim_snapshot(opt);
        opt.step(optim::StepInputs{.skip = {one1}});
        const auto after = optim_snapshot(opt);
        for (std::size_t k = 0; k < m.params.size(); ++k) {
          INFO("parameter " << m.params[k]->name);
          CHECK((after[k] == before[k]) == (k % 2 == 1));
        }
      }
    }
  });
}

TEST_CASE("optim - grad_scale multiplies the gradients" * doctest::timeout(60)) {
  optim_each_engine([&](Engine& e) {
    for (const OptimCase& c : optim_cases()) {
      INFO(std::string(c.what));
      OptimModel m = optim_model(e, true), r = optim_model(e, true);
      optim::Optimizer opt(m.list(), c.options), ref(r.list(), c.options);
      const Tensor q0 = Tensor::full(e, Shape{1}, 0.25f, Device::cpu(0)),
                   q1 = Tensor::full(e, Shape{1}, 0.25f, Device::cpu(1));
      for (std::int64_t t = 0; t < 5; ++t) {
        optim_set_grads(e, m, t);
        opt.step(optim::StepInputs{.grad_scale = {q0, q1}});
        optim_set_grads(e, r, t, 0.25f);  // exact: a power of two
        ref.step();
      }
      CHECK(optim_snapshot(opt) == optim_snapshot(ref));
    }
  });
}

TEST_CASE("optim - gradient clipping: the squared norm, the coefficient and clipped updates" * doctest::timeout(60)) {
  optim_each_engine([&](Engine& e) {
    OptimModel m = optim_model(e, false);
    optim_set_grads(e, m, 0);
    std::vector<Tensor> grads;
    double norm_sq = 0;
    for (std::size_t k = 0; k < m.params.size(); ++k) {
      grads.push_back(m.params[k]->grad);
      for (float g : optim_grad(k, 0)) norm_sq += static_cast<double>(g) * g;
    }
    const Tensor n2 = optim::grad_norm_squared(grads);
    CHECK(n2.shape() == Shape{1});
    CHECK(n2.device() == Device::cpu(0));
    CHECK(std::abs(n2.item() - norm_sq) <= 1e-7 * norm_sq);
    const float norm = std::sqrt(n2.item());
    for (float max_norm : {1.0f, 0.5f * norm, 2.0f * norm}) {
      INFO("max_norm " << max_norm);
      const float coef = optim::clip_coefficient(n2, max_norm).item();
      const float want = std::min(1.0f, max_norm / (std::sqrt(n2.item()) + 1e-6f));
      CHECK(coef == want);
      CHECK((max_norm >= norm) == (coef == 1.0f));
    }
    // A clipped step against the reference with the gradients times the
    // coefficient computed in double.
    const float max_norm = 0.1f * norm;
    for (const OptimCase& c : optim_cases()) {
      INFO(std::string(c.what));
      OptimModel w = optim_model(e, false);
      std::vector<OptimReference> refs;
      for (const auto& p : w.params) refs.emplace_back(c.options, p->value.to_host());
      optim::Optimizer opt(w.list(), c.options);
      for (std::int64_t t = 0; t < 10; ++t) {
        optim_set_grads(e, w, t);
        std::vector<Tensor> g;
        double sq = 0;
        for (std::size_t k = 0; k < w.params.size(); ++k) {
          g.push_back(w.params[k]->grad);
          for (float x : optim_grad(k, t)) sq += static_cast<double>(x) * x;
        }
        opt.step(optim::StepInputs{.grad_scale = {optim::clip_coefficient(optim::grad_norm_squared(g), max_norm)}});
        const double coef = std::min(1.0, max_norm / (std::sqrt(sq) + 1e-6));
        for (std::size_t k = 0; k < refs.size(); ++k) refs[k].step(optim_grad(k, t), c.options.lr, coef);
      }
      OptimAccuracy accuracy;
      for (std::size_t k = 0; k < refs.size(); ++k) accuracy.add(w.params[k]->value.to_host(), refs[k].w);
      accuracy.check();
    }
  });
}

TEST_CASE("optim - learning-rate schedules: factors, parse and str" * doctest::timeout(30)) {
  const auto constant = optim::LrSchedule::constant();
  CHECK(constant.factor(0) == 1.0f);
  CHECK(constant.factor(12345) == 1.0f);
  const auto warm = optim::LrSchedule::constant(4);
  CHECK(warm.factor(0) == 0.25f);
  CHECK(warm.factor(2) == 0.75f);
  CHECK(warm.factor(3) == 1.0f);
  CHECK(warm.factor(100) == 1.0f);
  const auto step = optim::LrSchedule::step(10, 0.5f);
  CHECK(step.factor(0) == 1.0f);
  CHECK(step.factor(9) == 1.0f);
  CHECK(step.factor(10) == 0.5f);
  CHECK(step.factor(25) == 0.25f);
  const auto step_warm = optim::LrSchedule::step(10, 0.5f, 5);
  CHECK(step_warm.factor(0) == 0.2f);
  CHECK(step_warm.factor(4) == 1.0f);
  CHECK(step_warm.factor(14) == 1.0f);
  CHECK(step_warm.factor(15) == 0.5f);
  const auto cosine = optim::LrSchedule::cosine(100);
  CHECK(cosine.factor(0) == 1.0f);
  CHECK(cosine.factor(50) == doctest::Approx(0.5).epsilon(1e-7));
  CHECK(cosine.factor(25) == doctest::Approx(0.5 * (1 + std::cos(std::numbers::pi / 4))).epsilon(1e-7));
  CHECK(cosine.factor(100) == doctest::Approx(0.0));
  CHECK(cosine.factor(150) == doctest::Approx(0.0));
  const auto cosine_warm = optim::LrSchedule::cosine(110, 10);
  CHECK(cosine_warm.factor(0) == 0.1f);
  CHECK(cosine_warm.factor(9) == 1.0f);
  CHECK(cosine_warm.factor(10) == 1.0f);
  CHECK(cosine_warm.factor(60) == doctest::Approx(0.5).epsilon(1e-7));
  CHECK(cosine_warm.lr(0.2f, 60) == doctest::Approx(0.1).epsilon(1e-7));

  for (const char* text : {"constant", "constant,warmup:5", "step:30", "step:30:0.5", "step:7:0.25,warmup:3",
                           "cosine:1000", "cosine:1000,warmup:100"}) {
    INFO(text);
    const auto s = optim::LrSchedule::parse(text);
    const auto again = optim::LrSchedule::parse(s.str());
    CHECK(again.str() == s.str());
    for (std::int64_t t : {0, 1, 4, 6, 29, 30, 31, 99, 500, 999, 1000, 2000}) CHECK(again.factor(t) == s.factor(t));
  }
  CHECK(optim::LrSchedule::parse("step:30").str() == "step:30:0.1");
  CHECK(optim::LrSchedule::parse("cosine:1000,warmup:100").str() == "cosine:1000,warmup:100");
  CHECK(optim::LrSchedule::parse("step:7:0.25").factor(7) == 0.25f);
  CHECK(optim::LrSchedule::parse("cosine:40").kind() == optim::LrSchedule::Kind::cosine);
  for (const char* bad : {"", "linear", "step", "step:x", "step:0", "step:3:-1", "step:3:abc", "cosine:10,warmup:10",
                          "cosine:10,warmup:-1", "constant,cooldown:3", "cosine:5:6", "constant:1"}) {
    INFO("'" << bad << "'");
    const std::string msg = optim_message([&] { optim::LrSchedule::parse(bad, "--lr-schedule"); });
    CHECK(msg.find("--lr-schedule") != std::string::npos);
    CHECK(msg.find(std::string("'") + bad + "'") != std::string::npos);
  }
  CHECK_THROWS_AS(optim::LrSchedule::cosine(10, 20), weft::InvalidArgument);
  CHECK_THROWS_AS(optim::LrSchedule::step(0), weft::InvalidArgument);
}

TEST_CASE("optim - options: parse, str, validation and state names" * doctest::timeout(30)) {
  CHECK(optim::OptimizerOptions::adamw(1e-3f).str() == "adamw(lr 0.001, betas (0.9, 0.999), eps 1e-08, weight decay 0.01)");
  CHECK(optim::OptimizerOptions::adam(1e-3f).str() == "adam(lr 0.001, betas (0.9, 0.999), eps 1e-08)");
  CHECK(optim::OptimizerOptions::sgd(0.1f, 0.9f, 5e-4f, true).str() ==
        "sgd(lr 0.1, momentum 0.9, nesterov, weight decay 5e-04)");
  CHECK(optim::OptimizerOptions::sgd(0.1f).str() == "sgd(lr 0.1)");

  const auto sgd = optim::OptimizerOptions::parse("sgd", 0.1f);
  CHECK(sgd.algorithm == optim::Algorithm::sgd);
  CHECK(sgd.momentum == 0.0f);
  CHECK(sgd.lr == 0.1f);
  const auto momentum = optim::OptimizerOptions::parse("momentum", 0.1f);
  CHECK(momentum.algorithm == optim::Algorithm::sgd);
  CHECK(momentum.momentum == 0.9f);
  CHECK(optim::OptimizerOptions::parse("adam", 1e-3f).algorithm == optim::Algorithm::adam);
  const auto adamw = optim::OptimizerOptions::parse("adamw", 1e-3f);
  CHECK(adamw.algorithm == optim::Algorithm::adamw);
  CHECK(adamw.weight_decay == 0.01f);
  const std::string unknown = optim_message([] { optim::OptimizerOptions::parse("lamb", 0.1f, "--optimizer"); });
  CHECK(unknown.find("--optimizer") != std::string::npos);
  CHECK(unknown.find("'lamb'") != std::string::npos);
  CHECK(unknown.find("adamw") != std::string::npos);

  auto field_error = [](optim::OptimizerOptions o, const char* field, const char* value) {
    INFO(field << " " << value);
    const std::string msg = optim_message([&] { o.validate("trainer"); });
    CHECK(msg.find("trainer") != std::string::npos);
    CHECK(msg.find(field) != std::string::npos);
    CHECK(msg.find(value) != std::string::npos);
  };
  optim::OptimizerOptions o = optim::OptimizerOptions::sgd(-0.5f);
  field_error(o, "lr", "-0.5");
  o = optim::OptimizerOptions::sgd(0.1f, 1.5f);
  field_error(o, "momentum", "1.5");
  o = optim::OptimizerOptions::sgd(0.1f, 0.9f, -1.0f);
  field_error(o, "weight_decay", "-1");
  o = optim::OptimizerOptions::sgd(0.1f, 0.0f, 0.0f, true);
  field_error(o, "nesterov", "momentum 0");
  o = optim::OptimizerOptions::sgd(0.1f, 0.9f, 0.0f, true);
  o.dampening = 0.5f;
  field_error(o, "nesterov", "dampening 0.5");
  o = optim::OptimizerOptions::adam(1e-3f);
  o.beta1 = 1.0f;
  field_error(o, "beta1", "1");
  o = optim::OptimizerOptions::adamw(1e-3f);
  o.beta2 = -0.1f;
  field_error(o, "beta2", "-0.1");
  o = optim::OptimizerOptions::adam(1e-3f);
  o.eps = 0.0f;
  field_error(o, "eps", "0");

  CHECK(optim::OptimizerOptions::sgd(0.1f).state_names().empty());
  CHECK(optim::OptimizerOptions::sgd(0.1f, 0.9f).state_names() == std::vector<std::string>{"momentum_buffer", "step"});
  CHECK(optim::OptimizerOptions::adam(0.1f).state_names() ==
        std::vector<std::string>{"exp_avg", "exp_avg_sq", "step"});
  CHECK(optim::OptimizerOptions::adamw(0.1f).state_names() ==
        std::vector<std::string>{"exp_avg", "exp_avg_sq", "step"});
}

TEST_CASE("optim - state tensors: named <parameter>.<state>, zero, on the parameter's device" * doctest::timeout(30)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 2, .workers_per_cpu_device = 2});
  OptimModel m = optim_model(*e, true);
  optim::Optimizer opt(m.list(), optim::OptimizerOptions::adamw(1e-3f));
  const std::vector<nn::Buffer*> state = opt.state();
  REQUIRE(state.size() == 3 * m.params.size());
  for (std::size_t k = 0; k < m.params.size(); ++k) {
    const nn::Parameter& p = *m.params[k];
    const char* names[] = {"exp_avg", "exp_avg_sq", "step"};
    for (std::size_t s = 0; s < 3; ++s) {
      const nn::Buffer& b = *state[k * 3 + s];
      CHECK(b.name == p.name + "." + names[s]);
      CHECK(b.value.name() == b.name);
      CHECK(b.value.device() == p.value.device());
      CHECK(b.value.dtype() == DType::float32);
      CHECK(b.value.shape() == (s == 2 ? Shape{1} : p.value.shape()));
      const std::vector<float> v = b.value.to_host();
      CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
    }
  }
  // The pointers survive moving the optimizer; a buffer written between steps
  // (a checkpoint's load) is what the next step reads.
  optim::Optimizer moved(std::move(opt));
  CHECK(moved.state() == state);
  CHECK(moved.parameters() == m.list());
  moved.set_steps(41);
  CHECK(moved.steps() == 41);
  CHECK_THROWS_AS(moved.set_steps(-1), weft::InvalidArgument);
  optim::OptimizerOptions plain = optim::OptimizerOptions::sgd(0.1f);
  CHECK(optim::Optimizer(m.list(), plain).state().empty());
  optim::Optimizer mom(m.list(), optim::OptimizerOptions::sgd(0.1f, 0.9f));
  REQUIRE(mom.state().size() == 2 * m.params.size());
  CHECK(mom.state()[0]->name == "layer0.weight.momentum_buffer");
  CHECK(mom.state()[1]->name == "layer0.weight.step");
  // A restored step count (here 1: the buffer is then blended, not replaced).
  optim_set_grads(*e, m, 0);
  for (std::size_t k = 0; k < m.params.size(); ++k) {
    const nn::Parameter& p = *m.params[k];
    mom.state()[2 * k]->value = Tensor::full(*e, p.value.shape(), 1.0f, p.value.device());
    mom.state()[2 * k + 1]->value = Tensor::full(*e, Shape{1}, 1.0f, p.value.device());
  }
  const std::vector<float> w0 = m.params[0]->value.to_host(), g0 = optim_grad(0, 0);
  mom.step();
  const std::vector<float> buf = mom.state()[0]->value.to_host(), w1 = m.params[0]->value.to_host();
  for (std::size_t i = 0; i < buf.size(); ++i) {
    // float32 operations, each rounded once, as the kernels compute.
    const float b = 0.9f * 1.0f + g0[i];
    CHECK(buf[i] == b);
    const float lr_b = 0.1f * b;
    CHECK(w1[i] == w0[i] - lr_b);
  }
  CHECK(mom.state()[1]->value.item() == 2.0f);
}

TEST_CASE("optim - bad parameters, gradients and step inputs are refused, naming them" * doctest::timeout(30)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 2, .workers_per_cpu_device = 1});
  OptimModel m = optim_model(*e, false);
  const auto adamw = optim::OptimizerOptions::adamw(1e-3f);

  std::vector<nn::Parameter*> with_null = m.list();
  with_null.push_back(nullptr);
  CHECK(optim_message([&] { optim::Optimizer o(with_null, adamw); }).find("parameter 5 is null") != std::string::npos);
  std::vector<nn::Parameter*> repeated = m.list();
  repeated.push_back(m.params[2].get());
  std::string msg = optim_message([&] { optim::Optimizer o(repeated, adamw); });
  CHECK(msg.find("'layer2.weight'") != std::string::npos);
  CHECK(msg.find("twice") != std::string::npos);
  nn::Parameter half{"half.weight", Tensor::zeros(*e, Shape{4}, Device::cpu(0), DType::bfloat16), Tensor()};
  msg = optim_message([&] { optim::Optimizer o({&half}, adamw); });
  CHECK(msg.find("'half.weight'") != std::string::npos);
  CHECK(msg.find("bfloat16") != std::string::npos);
  optim::OptimizerOptions bad = adamw;
  bad.eps = -1.0f;
  msg = optim_message([&] { optim::Optimizer o(m.list(), bad); });
  CHECK(msg.find("eps") != std::string::npos);
  CHECK(msg.find("-1") != std::string::npos);

  optim::Optimizer opt(m.list(), adamw);
  msg = optim_message([&] { opt.step(); });
  CHECK(msg.find("'layer0.weight'") != std::string::npos);
  CHECK(msg.find("no gradient") != std::string::npos);
  optim_set_grads(*e, m, 0);
  m.params[3]->grad = Tensor::zeros(*e, Shape{2}, Device::cpu(0));
  msg = optim_message([&] { opt.step(); });
  CHECK(msg.find("'layer3.weight'") != std::string::npos);
  CHECK(msg.find("[2]") != std::string::npos);
  m.params[3]->grad = Tensor::zeros(*e, Shape{1}, Device::cpu(1));
  msg = optim_message([&] { opt.step(); });
  CHECK(msg.find("'layer3.weight'") != std::string::npos);
  CHECK(msg.find("cpu(1)") != std::string::npos);
  m.params[3]->grad = Tensor::zeros(*e, Shape{1}, Device::cpu(0));

  auto skip_error = [&](Tensor t, const char* want) {
    INFO(want);
    t.set_name("found_inf");
    const std::string s = optim_message([&] { opt.step(optim::StepInputs{.skip = {t}}); });
    CHECK(s.find("skip 0") != std::string::npos);
    CHECK(s.find("'found_inf'") != std::string::npos);
    CHECK(s.find(want) != std::string::npos);
  };
  skip_error(Tensor::zeros(*e, Shape{2}, Device::cpu(0)), "[1] float32");
  skip_error(Tensor::zeros(*e, Shape{1}, Device::cpu(0), DType::float16), "float16");
  skip_error(Tensor::zeros(*e, Shape{1}, Device::cpu(1)), "no device of the parameters");
  const Tensor s0 = Tensor::zeros(*e, Shape{1}, Device::cpu(0));
  msg = optim_message([&] { opt.step(optim::StepInputs{.grad_scale = {s0, s0}}); });
  CHECK(msg.find("grad_scale") != std::string::npos);
  CHECK(msg.find("cpu(0)") != std::string::npos);
  msg = optim_message([&] { opt.step(-1.0f); });
  CHECK(msg.find("lr -1") != std::string::npos);
  // Refused steps pushed nothing: the state is still zero.
  CHECK(opt.steps() == 0);
  CHECK(opt.state()[2]->value.item() == 0.0f);

  CHECK(optim_message([] { optim::grad_norm_squared({}); }).find("grad_norm_squared") != std::string::npos);
  msg = optim_message([&] { optim::grad_norm_squared({m.params[0]->grad, Tensor::zeros(*e, Shape{3}, Device::cpu(1))}); });
  CHECK(msg.find("grad 1") != std::string::npos);
  CHECK(msg.find("cpu(1)") != std::string::npos);
  msg = optim_message([&] { optim::clip_coefficient(s0, 0.0f); });
  CHECK(msg.find("max_norm") != std::string::npos);
}
