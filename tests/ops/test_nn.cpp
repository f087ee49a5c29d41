// weft::nn layers: every layer's backward (input and parameter gradients)
// against central finite differences of a scalar loss sum(forward(x) * r)
// taken through forward; LeNet's shapes and parameter count; an MLP learning
// a small separable problem; naive and threaded engines computing bitwise the
// same; the misuse errors; and layers letting go of what they kept.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "weft/engine.h"
#include "weft/error.h"
#include "weft/nn.h"
#include "weft/ops.h"
#include "weft/tensor.h"
#include "ops/layer_test_util.h"

namespace nn = weft::nn;
using weft::Engine;
using weft::EngineConfig;
using weft::Shape;
using weft::Tensor;

using namespace weft_test::layers;

namespace {

std::unique_ptr<Engine> threaded_engine() {
  return Engine::create(EngineConfig{.kind = "threaded", .workers_per_cpu_device = 2});
}

// A Dense layer whose backward is off by a small factor in one place: the
// gradient check must notice.
class SkewedDense : public nn::Dense {
 public:
  SkewedDense(Engine& engine, bool skew_dx) : nn::Dense(engine, 5, 3, {}, 11), skew_dx_(skew_dx) {}
  Tensor backward(const Tensor& dy) override {
    Tensor dx = nn::Dense::backward(dy);
    if (skew_dx_) return dx * 1.02f;
    weight().grad = weight().grad * 1.02f;
    return dx;
  }

 private:
  bool skew_dx_;
};

std::vector<float> host(const Tensor& t) { return t.to_host(); }

// Whether `t` is the last handle on its storage within a second. A worker
// may still be dropping a finished op's closure (which holds the storage)
// just after a wait returns, so this polls.
bool sole_owner_soon(const Tensor& t) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (t.storage().use_count() != 1) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_CASE("nn Dense backward matches finite differences") {
  auto engine = naive_engine();
  nn::Dense layer(*engine, 5, 3, {}, 11);
  // A non-zero bias, so its use in forward is exercised too.
  layer.bias().value.copy_from(Tensor::from_host(*engine, Shape{3}, random_vec(3, 12)));
  check_gradients(*engine, layer, Shape{4, 5}, random_vec(20, 13), 14);
}

TEST_CASE("nn gradient check catches a gradient off by 2 percent") {
  auto engine = naive_engine();
  for (bool skew_dx : {true, false}) {
    SkewedDense layer(*engine, skew_dx);
    const std::string mismatch = gradient_mismatch(*engine, layer, Shape{4, 5}, random_vec(20, 13), 14);
    INFO(mismatch);
    CHECK(mismatch.find(skew_dx ? "dx[" : "d dense.weight[") == 0);
  }
}

TEST_CASE("nn Conv2d backward matches finite differences") {
  auto engine = naive_engine();
  SUBCASE("stride 1, no padding") {
    nn::Conv2d layer(*engine, 2, 3, 3, nn::Conv2dParams{}, {}, 21);
    check_gradients(*engine, layer, Shape{2, 2, 5, 6}, random_vec(2 * 2 * 5 * 6, 22), 23);
  }
  SUBCASE("stride 2, padding 1") {
    nn::Conv2d layer(*engine, 3, 2, 3, nn::Conv2dParams{.stride = 2, .pad = 1}, {}, 24);
    layer.bias().value.copy_from(Tensor::from_host(*engine, Shape{2}, random_vec(2, 25)));
    check_gradients(*engine, layer, Shape{1, 3, 7, 5}, random_vec(3 * 7 * 5, 26), 27);
  }
}

TEST_CASE("nn ReLU backward matches finite differences") {
  auto engine = naive_engine();
  nn::ReLU layer;
  check_gradients(*engine, layer, Shape{3, 7}, away_from_zero(21, 31, 0.05f), 32);
  check_gradients(*engine, layer, Shape{2, 3, 5, 3}, away_from_zero(90, 33, 0.05f), 34);
}

TEST_CASE("nn AvgPool2d backward matches finite differences") {
  auto engine = naive_engine();
  SUBCASE("window 2 stride 2, odd input (last row and column unused)") {
    nn::AvgPool2d layer(nn::Pool2dParams{2, 2});
    check_gradients(*engine, layer, Shape{2, 3, 5, 7}, random_vec(210, 41), 42);
  }
  SUBCASE("overlapping windows: 3 stride 1") {
    nn::AvgPool2d layer(nn::Pool2dParams{3, 1});
    check_gradients(*engine, layer, Shape{1, 2, 5, 4}, random_vec(40, 43), 44);
  }
}

TEST_CASE("nn MaxPool2d backward matches finite differences") {
  auto engine = naive_engine();
  SUBCASE("window 2 stride 2, odd input") {
    nn::MaxPool2d layer(nn::Pool2dParams{2, 2});
    check_gradients(*engine, layer, Shape{2, 3, 5, 7}, distinct_values(210, 51, 0.05f), 52);
  }
  SUBCASE("overlapping windows: 3 stride 2") {
    nn::MaxPool2d layer(nn::Pool2dParams{3, 2});
    check_gradients(*engine, layer, Shape{1, 2, 7, 5}, distinct_values(70, 53, 0.05f), 54);
  }
}

TEST_CASE("nn Flatten backward matches finite differences") {
  auto engine = naive_engine();
  nn::Flatten layer;
  CHECK(layer.output_shape(Shape{2, 3, 5, 1}) == Shape{2, 15});
  check_gradients(*engine, layer, Shape{2, 3, 5, 1}, random_vec(30, 61), 62);
}

TEST_CASE("nn Sequential backward matches finite differences") {
  auto engine = naive_engine();
  nn::Sequential net;
  net.emplace<nn::Conv2d>(*engine, 2, 3, 3, nn::Conv2dParams{.stride = 1, .pad = 1}, weft::Device{}, 71);
  net.emplace<nn::ReLU>();
  net.emplace<nn::MaxPool2d>(nn::Pool2dParams{2, 2});
  net.emplace<nn::AvgPool2d>(nn::Pool2dParams{1, 1});
  net.emplace<nn::Flatten>();
  net.emplace<nn::Dense>(*engine, 3 * 2 * 3, 5, weft::Device{}, 72);
  net.emplace<nn::ReLU>();
  net.emplace<nn::Dense>(*engine, 5, 4, weft::Device{}, 73, nn::Init::xavier_uniform);
  CHECK(net.parameters().size() == 6);
  CHECK(net.output_shape(Shape{2, 2, 5, 7}) == Shape{2, 4});
  // Piecewise linear in each coordinate: exact away from ReLU / max-pool
  // kinks, which a few perturbations may cross.
  check_gradients(*engine, net, Shape{2, 2, 5, 7}, random_vec(140, 74), 75,
                  GradCheckOptions{.step = 1e-2, .atol = 2e-3, .rtol = 1e-2, .max_skipped = 0.05});
}

TEST_CASE("nn lenet has D2L's shapes and parameter count") {
  auto engine = threaded_engine();
  auto net = nn::lenet(*engine, {}, 7);
  const std::vector<nn::Parameter*> params = net->parameters();
  REQUIRE(params.size() == 8);
  const std::vector<std::pair<std::string, Shape>> want = {
      {"conv1.weight", Shape{20, 1, 3, 3}}, {"conv1.bias", Shape{20}},    {"conv2.weight", Shape{50, 20, 5, 5}},
      {"conv2.bias", Shape{50}},            {"fc1.weight", Shape{128, 800}}, {"fc1.bias", Shape{128}},
      {"fc2.weight", Shape{10, 128}},       {"fc2.bias", Shape{10}}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    CHECK(params[i]->name == want[i].first);
    CHECK(params[i]->value.shape() == want[i].second);
    CHECK_FALSE(params[i]->grad.defined());
  }
  CHECK(nn::parameter_count(params) == 180 + 20 + 25000 + 50 + 102400 + 128 + 1280 + 10);
  CHECK(net->output_shape(Shape{5, 1, 28, 28}) == Shape{5, 10});

  const Tensor x = Tensor::from_host(*engine, Shape{3, 1, 28, 28}, random_vec(3 * 784, 8, 0.0f, 1.0f));
  const Tensor y = net->forward(x);
  CHECK(y.shape() == Shape{3, 10});
  for (float v : y.to_host()) CHECK(std::isfinite(v));

  // Biases start at zero; weights within their init bounds and not constant.
  for (nn::Parameter* p : params) {
    const std::vector<float> v = p->value.to_host();
    if (p->value.shape().rank() == 1) {
      CHECK_MESSAGE(std::all_of(v.begin(), v.end(), [](float b) { return b == 0.0f; }), p->name);
    } else {
      const i64 fan_in = p->value.numel() / p->value.shape()[0];
      const double bound = std::sqrt(6.0 / static_cast<double>(fan_in));
      const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      CHECK_MESSAGE(*lo >= -bound, p->name);
      CHECK_MESSAGE(*hi <= bound, p->name);
      CHECK_MESSAGE(*hi - *lo > bound, p->name);
    }
  }

  const std::string d = net->describe();
  CHECK(d.find("Conv2d(20 -> 50, kernel 5, stride 1, pad 0) -> [N, 50, 9, 9]") != std::string::npos);
  CHECK(d.find("Dense(128 -> 10) -> [N, 10]") != std::string::npos);
  CHECK(d.find("129068 parameters") != std::string::npos);

  // Another seed gives other weights; the same seed the same ones.
  auto same = nn::lenet(*engine, {}, 7);
  auto other = nn::lenet(*engine, {}, 8);
  CHECK(bitwise_equal(host(params[0]->value), host(same->parameters()[0]->value)));
  CHECK_FALSE(bitwise_equal(host(params[0]->value), host(other->parameters()[0]->value)));
  CHECK_FALSE(bitwise_equal(host(params[2]->value), host(other->parameters()[2]->value)));
}

TEST_CASE("nn mlp learns a small separable problem") {
  auto engine = threaded_engine();
  // Three well separated Gaussian blobs in 2-D, 30 points each.
  const i64 per_class = 30, classes = 3, n = per_class * classes;
  const float centers[3][2] = {{-2.0f, 0.0f}, {2.0f, 1.0f}, {0.0f, -2.5f}};
  std::mt19937_64 gen(99);
  std::normal_distribution<float> noise(0.0f, 0.4f);
  std::vector<float> xs, labels;
  for (i64 i = 0; i < n; ++i) {
    const i64 c = i % classes;
    xs.push_back(centers[c][0] + noise(gen));
    xs.push_back(centers[c][1] + noise(gen));
    labels.push_back(static_cast<float>(c));
  }
  auto net = nn::mlp(*engine, {2, 16, 16, 3}, {}, 5);
  CHECK(net->size() == 5);  // dense, relu, dense, relu, dense
  CHECK(nn::parameter_count(net->parameters()) == (2 * 16 + 16) + (16 * 16 + 16) + (16 * 3 + 3));
  const Tensor x = Tensor::from_host(*engine, Shape{n, 2}, xs);
  const Tensor y = Tensor::from_host(*engine, Shape{n}, labels);
  const auto params = net->parameters();

  std::vector<Tensor> losses;  // read at the end: no wait per step
  Tensor pred;
  for (int step = 0; step < 300; ++step) {
    const Tensor logits = net->forward(x);
    const auto sce = weft::ops::softmax_cross_entropy(logits, y);
    losses.push_back(sce.loss);
    net->backward(sce.dlogits);
    nn::sgd_step(params, 0.05f);
  }
  net->train(false);
  pred = weft::ops::argmax(net->forward(x));
  const float first = losses.front().item(), last = losses.back().item();
  INFO("loss " << first << " -> " << last);
  CHECK(std::isfinite(first));
  CHECK(last < 0.5f * first);
  const std::vector<float> p = pred.to_host();
  i64 correct = 0;
  for (i64 i = 0; i < n; ++i) correct += p[static_cast<std::size_t>(i)] == labels[static_cast<std::size_t>(i)];
  CHECK(correct >= n * 9 / 10);

  // Deterministic: the same run again gives the same final loss, bitwise.
  auto net2 = nn::mlp(*engine, {2, 16, 16, 3}, {}, 5);
  Tensor last2;
  for (int step = 0; step < 300; ++step) {
    const auto sce = weft::ops::softmax_cross_entropy(net2->forward(x), y);
    last2 = sce.loss;
    net2->backward(sce.dlogits);
    nn::sgd_step(net2->parameters(), 0.05f);
  }
  CHECK(last2.item() == last);
}

TEST_CASE("nn naive and threaded engines compute bitwise the same") {
  auto naive = naive_engine();
  auto threaded = threaded_engine();
  const std::vector<float> images = random_vec(4 * 784, 81, 0.0f, 1.0f);
  const std::vector<float> labels = {3, 0, 9, 4};
  struct Result {
    std::vector<float> logits, dx;
    std::vector<std::vector<float>> params_after;
  };
  // Three SGD steps of the model; the last step's logits and dx, the weights after.
  auto run = [&](Engine& engine, bool lenet) {
    std::unique_ptr<nn::Sequential> net;
    if (lenet) {
      net = nn::lenet(engine, {}, 82);
    } else {  // max pooling, padding and stride, which LeNet lacks
      net = std::make_unique<nn::Sequential>();
      net->emplace<nn::Conv2d>(engine, 1, 6, 5, nn::Conv2dParams{.stride = 2, .pad = 2}, weft::Device{}, 83);
      net->emplace<nn::ReLU>();
      net->emplace<nn::MaxPool2d>(nn::Pool2dParams{3, 2});
      net->emplace<nn::Flatten>();
      net->emplace<nn::Dense>(engine, 6 * 6 * 6, 10, weft::Device{}, 84);
    }
    Result res;
    const Tensor x = Tensor::from_host(engine, Shape{4, 1, 28, 28}, images);
    const Tensor y = Tensor::from_host(engine, Shape{4}, labels);
    const auto params = net->parameters();
    Tensor logits, dx;
    for (int step = 0; step < 3; ++step) {
      logits = net->forward(x);
      const auto sce = weft::ops::softmax_cross_entropy(logits, y);
      dx = net->backward(sce.dlogits);
      nn::sgd_step(params, 0.1f);
    }
    res.logits = logits.to_host();
    res.dx = dx.to_host();
    for (nn::Parameter* p : params) res.params_after.push_back(p->value.to_host());
    return res;
  };
  for (bool lenet : {true, false}) {
    INFO((lenet ? "lenet" : "conv + max pool model"));
    const Result a = run(*naive, lenet), b = run(*threaded, lenet);
    CHECK(bitwise_equal(a.logits, b.logits));
    CHECK(bitwise_equal(a.dx, b.dx));
    REQUIRE(a.params_after.size() == b.params_after.size());
    for (std::size_t i = 0; i < a.params_after.size(); ++i)
      CHECK(bitwise_equal(a.params_after[i], b.params_after[i]));
  }
}

TEST_CASE("nn misuse is a weft::Error naming the layer") {
  auto engine = naive_engine();
  nn::Dense dense(*engine, 4, 2, {}, 1);
  const Tensor x = Tensor::from_host(*engine, Shape{3, 4}, random_vec(12, 2));
  const Tensor dy = Tensor::from_host(*engine, Shape{3, 2}, random_vec(6, 3));

  CHECK_THROWS_WITH_AS(dense.backward(dy), doctest::Contains("Dense: backward without"), weft::Error);
  CHECK_THROWS_WITH_AS(dense.forward(Tensor::from_host(*engine, Shape{3, 5}, random_vec(15, 4))),
                       doctest::Contains("Dense(4 -> 2): input must be [N, 4]"), weft::Error);
  CHECK_THROWS_WITH_AS(nn::sgd_step(dense.parameters(), 0.1f), doctest::Contains("'dense.weight' has no gradient"),
                       weft::Error);
  dense.forward(x);
  CHECK_THROWS_WITH_AS(dense.backward(Tensor::from_host(*engine, Shape{2, 2}, random_vec(4, 5))),
                       doctest::Contains("dy [2, 2]"), weft::Error);
  Tensor named_dy = Tensor::from_host(*engine, Shape{2, 2}, random_vec(4, 5));
  named_dy.set_name("loss.grad");
  CHECK_THROWS_WITH_AS(dense.backward(named_dy),
                       doctest::Contains("Dense: backward got dy 'loss.grad' [2, 2], the last forward's output is "
                                         "[3, 2]"),
                       weft::Error);
  dense.forward(x);
  dense.backward(dy);
  CHECK_THROWS_AS(dense.backward(dy), weft::Error);  // backward consumed what forward kept
  dense.train(false);
  dense.forward(x);
  CHECK_THROWS_AS(dense.backward(dy), weft::Error);  // evaluation mode keeps nothing

  nn::Conv2d conv(*engine, 3, 2, 3, {}, {}, 6);
  CHECK_THROWS_WITH_AS(conv.forward(Tensor::from_host(*engine, Shape{1, 2, 5, 5}, random_vec(50, 7))),
                       doctest::Contains("input must be [N, 3, H, W]"), weft::Error);
  CHECK_THROWS_WITH_AS(conv.output_shape(Shape{1, 3, 2, 5}), doctest::Contains("smaller than the filter"), weft::Error);
  CHECK_THROWS_AS(nn::MaxPool2d(nn::Pool2dParams{3, 1}).output_shape(Shape{1, 1, 2, 2}), weft::Error);
  CHECK_THROWS_AS(nn::Dense(*engine, 0, 2), weft::Error);
  CHECK_THROWS_AS(nn::mlp(*engine, {4}), weft::Error);
  nn::Sequential seq;
  CHECK_THROWS_AS(seq.add(nullptr), weft::Error);
}

TEST_CASE("nn layers keep inputs only from forward to backward") {
  auto engine = threaded_engine();
  auto net = nn::lenet(*engine, {}, 3);
  Tensor x = Tensor::from_host(*engine, Shape{2, 1, 28, 28}, random_vec(2 * 784, 4, 0.0f, 1.0f));
  SUBCASE("training: backward lets go") {
    const Tensor y = net->forward(x);
    CHECK(x.storage().use_count() > 1);  // conv1 keeps its input for backward
    net->backward(Tensor::from_host(*engine, y.shape(), random_vec(20, 5)));
    engine->wait_all();
    CHECK(sole_owner_soon(x));
  }
  SUBCASE("evaluation: forward keeps nothing") {
    net->train(false);
    net->forward(x).wait_to_read();
    engine->wait_all();
    CHECK(sole_owner_soon(x));
  }
}

TEST_CASE("nn derive_seed spreads seeds") {
  CHECK(nn::derive_seed(0, 0) != nn::derive_seed(0, 1));
  CHECK(nn::derive_seed(0, 1) != nn::derive_seed(1, 0));
  CHECK(nn::derive_seed(1, 0) != nn::derive_seed(2, 0));
  CHECK(nn::derive_seed(5, 3) == nn::derive_seed(5, 3));
}

// Parameter and gradient names reach the profiler's per-variable table, the
// trace's read and write sets, and shape errors.
TEST_CASE("nn parameter names reach the profiler, the trace and errors") {
  for (auto make : {naive_engine, threaded_engine}) {
    auto e = make();
    nn::Dense fc(*e, 4, 3, weft::Device::cpu(0), 1, nn::Init::kaiming_uniform, "fc1");
    const Tensor x = Tensor::uniform(*e, Shape{2, 4}, -1.0f, 1.0f, 2).set_name("batch");
    e->profiler().start();
    const Tensor y = fc.forward(x);
    fc.backward(Tensor::ones(*e, y.shape()));
    nn::sgd_step(fc.parameters(), 0.1f);
    e->wait_all();
    e->profiler().stop();

    std::vector<std::string> written;
    for (const weft::VarStats& v : e->profiler().aggregate_by_variable()) written.push_back(v.name);
    for (const char* name : {"fc1.weight", "fc1.bias", "fc1.weight.grad", "fc1.bias.grad"})
      CHECK_MESSAGE(std::find(written.begin(), written.end(), name) != written.end(), name);

    std::ostringstream trace;
    e->profiler().write_trace(trace);
    const bool forward_reads_named = trace.str().find(R"("reads":["batch","fc1.weight")") != std::string::npos ||
                                     trace.str().find(R"("reads":["fc1.weight","batch")") != std::string::npos;
    CHECK(forward_reads_named);

    const Tensor wrong = Tensor::zeros(*e, Shape{2, 5}).set_name("wrong batch");
    try {
      (void)fc.forward(wrong);
      FAIL("a [2, 5] input to a 4-input Dense was accepted");
    } catch (const weft::InvalidArgument& err) {
      CHECK(std::string(err.what()).find("wrong batch") != std::string::npos);
    }
  }
}
