// The GPT layers and model (weft/nn_transformer.h) on CPU devices: the
// model's loss and every parameter's gradient against a float64 GPT written
// here from the weights (forward by its definition, gradients by central
// finite differences), tied and untied, in every precision; the layers'
// contracts (ties, names, saved state, evaluation mode) and the bad inputs.
// Each numeric case runs on the naive engine and on the threaded one at
// every worker count of test_workers.h.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor_test_util.h"
#include "weft/engine.h"
#include "weft/nn.h"
#include "weft/ops.h"

namespace {

using weft::Device;
using weft::DType;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
using weft_optest::error_of;
using weft_optest::finite_differences;
using weft_optest::for_each_engine_and_workers;
using weft_optest::has;
using weft_optest::i64;
using weft_optest::sz;
using weft_optest::Vec;
namespace nn = weft::nn;
namespace ops = weft::ops;

// Small enough for finite differences over every parameter.
nn::GptConfig small_config(bool tie = true) {
  return nn::GptConfig{.vocab = 11, .context = 8, .layers = 2, .heads = 2, .width = 8, .tie_weights = tie};
}

using Params = std::map<std::string, Vec>;

Params host_params(nn::Sequential& model) {
  Params out;
  for (nn::Parameter* p : model.parameters()) out[p->name] = weft_optest::dbl(p->value.to_host());
  return out;
}

// Weights large enough that GELU, softmax and layer norm are far from
// linear (GPT-2's 0.02 leaves the small model nearly linear): U(-0.6, 0.6),
// layer norm weights 1 + U(-0.3, 0.3). The same on every engine.
void randomize(Engine& e, nn::Sequential& model) {
  weft_optest::Rng rng(17);
  for (nn::Parameter* p : model.parameters()) {
    const bool norm_weight = p->name.find("ln_") != std::string::npos && p->name.ends_with(".weight");
    std::vector<float> v = rng.vec(p->value.numel(), -0.6f, 0.6f);
    if (norm_weight)
      for (float& x : v) x = 1.0f + x / 2.0f;
    p->value.copy_from(Tensor::from_host(e, p->value.shape(), v, p->value.device()));
  }
}

// ---- the float64 GPT -------------------------------------------------------

Vec layer_norm(const Vec& x, i64 rows, i64 c, const Vec& w, const Vec& b) {
  Vec y(x.size());
  for (i64 r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0;
    for (i64 j = 0; j < c; ++j) mean += x[sz(r * c + j)];
    mean /= static_cast<double>(c);
    for (i64 j = 0; j < c; ++j) var += (x[sz(r * c + j)] - mean) * (x[sz(r * c + j)] - mean);
    var /= static_cast<double>(c);
    const double rstd = 1.0 / std::sqrt(var + 1e-5);
    for (i64 j = 0; j < c; ++j) y[sz(r * c + j)] = (x[sz(r * c + j)] - mean) * rstd * w[sz(j)] + b[sz(j)];
  }
  return y;
}

// y [rows, out] = x [rows, in] w^T + b (w [out, in]; b may be empty).
Vec dense(const Vec& x, i64 rows, i64 in, const Vec& w, const Vec& b, i64 out) {
  Vec y(sz(rows * out));
  for (i64 r = 0; r < rows; ++r)
    for (i64 o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[sz(o)];
      for (i64 i = 0; i < in; ++i) s += x[sz(r * in + i)] * w[sz(o * in + i)];
      y[sz(r * out + o)] = s;
    }
  return y;
}

double gelu(double x) {
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// The mean next-token loss of the model with weights p on ids/targets [b, t].
double gpt_loss(const nn::GptConfig& cfg, const Params& p, const std::vector<float>& ids,
                const std::vector<float>& targets, i64 b, i64 t) {
  const i64 c = cfg.width, h = cfg.heads, d = c / h, rows = b * t;
  const Vec& wte = p.at("wte.weight");
  const Vec& wpe = p.at("wpe.weight");
  Vec x(sz(rows * c));
  for (i64 r = 0; r < rows; ++r)
    for (i64 j = 0; j < c; ++j)
      x[sz(r * c + j)] = wte[sz(static_cast<i64>(ids[sz(r)]) * c + j)] + wpe[sz((r % t) * c + j)];
  for (i64 l = 0; l < cfg.layers; ++l) {
    const std::string n = "h." + std::to_string(l) + ".";
    const Vec a_in = layer_norm(x, rows, c, p.at(n + "ln_1.weight"), p.at(n + "ln_1.bias"));
    const Vec qkv = dense(a_in, rows, c, p.at(n + "attn.c_attn.weight"), p.at(n + "attn.c_attn.bias"), 3 * c);
    Vec o(sz(rows * c), 0.0);
    for (i64 bb = 0; bb < b; ++bb)
      for (i64 hh = 0; hh < h; ++hh)
        for (i64 i = 0; i < t; ++i) {
          auto at = [&](i64 pos, i64 which, i64 j) { return qkv[sz((bb * t + pos) * 3 * c + which * c + hh * d + j)]; };
          std::vector<double> s(sz(i + 1));
          double mx = -1e300;
          for (i64 k = 0; k <= i; ++k) {
            double dot = 0.0;
            for (i64 j = 0; j < d; ++j) dot += at(i, 0, j) * at(k, 1, j);
            s[sz(k)] = dot / std::sqrt(static_cast<double>(d));
            mx = std::max(mx, s[sz(k)]);
          }
          double sum = 0.0;
          for (double& v : s) sum += (v = std::exp(v - mx));
          for (i64 j = 0; j < d; ++j) {
            double acc = 0.0;
            for (i64 k = 0; k <= i; ++k) acc += s[sz(k)] / sum * at(k, 2, j);
            o[sz((bb * t + i) * c + hh * d + j)] = acc;
          }
        }
    const Vec a = dense(o, rows, c, p.at(n + "attn.c_proj.weight"), p.at(n + "attn.c_proj.bias"), c);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += a[i];
    const Vec m_in = layer_norm(x, rows, c, p.at(n + "ln_2.weight"), p.at(n + "ln_2.bias"));
    Vec f = dense(m_in, rows, c, p.at(n + "mlp.c_fc.weight"), p.at(n + "mlp.c_fc.bias"), 4 * c);
    for (double& v : f) v = gelu(v);
    const Vec m = dense(f, rows, 4 * c, p.at(n + "mlp.c_proj.weight"), p.at(n + "mlp.c_proj.bias"), c);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += m[i];
  }
  const Vec hf = layer_norm(x, rows, c, p.at("ln_f.weight"), p.at("ln_f.bias"));
  const Vec logits = dense(hf, rows, c, cfg.tie_weights ? wte : p.at("lm_head.weight"), {}, cfg.vocab);
  double loss = 0.0;
  for (i64 r = 0; r < rows; ++r) {
    double mx = -1e300;
    for (i64 v = 0; v < cfg.vocab; ++v) mx = std::max(mx, logits[sz(r * cfg.vocab + v)]);
    double sum = 0.0;
    for (i64 v = 0; v < cfg.vocab; ++v) sum += std::exp(logits[sz(r * cfg.vocab + v)] - mx);
    loss += std::log(sum) + mx - logits[sz(r * cfg.vocab + static_cast<i64>(targets[sz(r)]))];
  }
  return loss / static_cast<double>(rows);
}

// ---- data ------------------------------------------------------------------

struct Batch {
  i64 b = 2, t = 7;
  std::vector<float> ids, targets;
};

Batch make_batch(i64 vocab, i64 b, i64 t, std::uint64_t salt) {
  weft_optest::Rng rng(salt);
  Batch out{b, t, {}, {}};
  for (i64 i = 0; i < b * t; ++i) {
    out.ids.push_back(static_cast<float>(rng.integer(0, vocab - 1)));
    out.targets.push_back(static_cast<float>(rng.integer(0, vocab - 1)));
  }
  return out;
}

// One training forward and backward; returns the loss.
float forward_backward(Engine& e, nn::Sequential& model, const Batch& batch, Device dev = Device::cpu(0)) {
  const Tensor ids = Tensor::from_host(e, Shape{batch.b, batch.t}, batch.ids, dev);
  const Tensor targets = Tensor::from_host(e, Shape{batch.b, batch.t}, batch.targets, dev);
  const Tensor logits = model.forward(ids);
  ops::SoftmaxCrossEntropy l = nn::lm_loss(logits, targets);
  model.backward(l.dlogits);
  return l.loss.item();
}

void check_gradients(const nn::GptConfig& cfg, bool tie) {
  const Batch batch = make_batch(cfg.vocab, 2, 7, 5);
  Params reference;  // the first engine's weights; the others must build the same
  std::map<std::string, Vec> want_grad;
  double want_loss = 0.0;
  for_each_engine_and_workers([&](Engine& e) {
    auto model = nn::gpt(e, cfg, Device::cpu(0), 3);
    randomize(e, *model);
    const Params p = host_params(*model);
    if (reference.empty()) {
      reference = p;
      want_loss = gpt_loss(cfg, p, batch.ids, batch.targets, batch.b, batch.t);
      for (const auto& [name, values] : p) {
        want_grad[name] = finite_differences(values, [&, name = name](const Vec& v) {
          Params q = reference;
          q[name] = v;
          return gpt_loss(cfg, q, batch.ids, batch.targets, batch.b, batch.t);
        });
      }
    }
    REQUIRE(p == reference);
    CHECK(p.count("lm_head.weight") == (tie ? 0u : 1u));
    const float loss = forward_backward(e, *model, batch);
    CHECK(std::abs(loss - want_loss) <= 1e-5 * std::max(1.0, std::abs(want_loss)));
    for (nn::Parameter* param : model->parameters()) {
      INFO("parameter " << param->name);
      REQUIRE(param->grad.defined());
      weft_optest::close(param->grad.to_host(), want_grad.at(param->name), param->name + ".grad", 2e-4, 1e-6);
    }
  });
}

}  // namespace

TEST_CASE("gpt: loss and every parameter's gradient against a float64 GPT, tied weights" * doctest::timeout(300)) {
  check_gradients(small_config(true), true);
}

TEST_CASE("gpt: loss and every parameter's gradient against a float64 GPT, untied" * doctest::timeout(300)) {
  check_gradients(small_config(false), false);
}

TEST_CASE("gpt: bf16, fp16 and tf32 against the float64 GPT within their roundings" * doctest::timeout(300)) {
  const nn::GptConfig cfg = small_config(true);
  const Batch batch = make_batch(cfg.vocab, 2, 7, 9);
  struct Case {
    weft::Precision precision;
    double loss_rtol, grad_rtol;  // a few units of the half type over the model's depth; tf32's 2^-11
  };
  const Case cases[] = {{weft::Precision::bf16, 3e-2, 6e-2},
                        {weft::Precision::fp16, 4e-3, 1e-2},
                        {weft::Precision::tf32, 4e-3, 1e-2}};
  weft_optest::for_each_engine([&](Engine& e) {
    for (const Case& c : cases) {
      INFO("precision " << weft::to_string(c.precision));
      auto model = nn::gpt(e, cfg, Device::cpu(0), 3);
      randomize(e, *model);
      const Params p = host_params(*model);
      const double want = gpt_loss(cfg, p, batch.ids, batch.targets, batch.b, batch.t);
      model->set_precision(c.precision);
      const float loss = forward_backward(e, *model, batch);
      CHECK(std::abs(loss - want) <= c.loss_rtol * std::abs(want));
      for (nn::Parameter* param : model->parameters()) {
        REQUIRE(param->grad.defined());
        CHECK(param->grad.dtype() == DType::float32);
        const Vec want_grad = finite_differences(p.at(param->name), [&, name = param->name](const Vec& v) {
          Params q = p;
          q[name] = v;
          return gpt_loss(cfg, q, batch.ids, batch.targets, batch.b, batch.t);
        });
        weft_optest::close(param->grad.to_host(), want_grad, param->name + ".grad", c.grad_rtol, 1e-6);
      }
    }
  });
}

TEST_CASE("gpt: weight tying, names and the model's description" * doctest::timeout(60)) {
  auto engine = Engine::create({.kind = "naive", .cpu_devices = 1});
  const nn::GptConfig small = nn::GptConfig::small();
  CHECK(small.describe() == "layers 12, heads 12, width 768, context 1024, vocab 50257");
  CHECK(nn::GptConfig::tiny().describe() == "layers 4, heads 4, width 128, context 128, vocab 256");
  auto model = nn::gpt(*engine, nn::GptConfig::tiny());
  CHECK(model->size() == 8);  // wte, wpe, 4 blocks, ln_f, lm_head
  CHECK(nn::parameter_count(model->parameters()) == 842'496);
  auto& head = (*model)[7];
  CHECK(head.parameters().empty());
  REQUIRE(head.tied_parameters().size() == 1);
  CHECK(head.tied_parameters()[0] == (*model)[0].parameters()[0]);
  CHECK(model->tied_parameters().empty());  // the tie is inside the model
  std::vector<std::string> names;
  for (nn::Parameter* p : model->parameters()) names.push_back(p->name);
  CHECK(names.front() == "wte.weight");
  CHECK(std::find(names.begin(), names.end(), "h.3.attn.c_attn.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "h.0.mlp.c_proj.bias") != names.end());
  CHECK(names.back() == "ln_f.bias");
  CHECK(has(model->describe(), "LMHead(128 -> 256, tied to wte.weight)"));
  auto untied = nn::gpt(*engine, {.vocab = 256, .context = 128, .layers = 4, .heads = 4, .width = 128, .tie_weights = false});
  CHECK(nn::parameter_count(untied->parameters()) == 842'496 + 256 * 128);
  CHECK((*untied)[7].tied_parameters().empty());
}

TEST_CASE("gpt: bad input names the tensor, the index, the shape" * doctest::timeout(60)) {
  weft_optest::for_each_engine([](Engine& e) {
    const nn::GptConfig cfg = small_config();
    auto model = nn::gpt(e, cfg, Device::cpu(0), 1);
    // A token id beyond the vocabulary: the op fails, naming ids, the index and the size.
    std::vector<float> ids(14, 1.0f);
    ids[5] = 11.0f;
    const Tensor bad = Tensor::from_host(e, Shape{2, 7}, ids, Device::cpu(0));
    const std::string beyond = error_of([&] { model->forward(bad).wait_to_read(); });
    CHECK(has(beyond, "11"));
    CHECK(has(beyond, "5"));
    CHECK(has(beyond, "vocab"));
    e.wait_all();
    model->train(false);
    // A sequence longer than the context: refused at push.
    const Tensor long_seq = Tensor::zeros(e, Shape{1, 9}, Device::cpu(0));
    const std::string longer = error_of([&] { model->forward(long_seq); });
    CHECK(has(longer, "9 positions is longer than the context, 8"));
    // Heads that do not divide the width.
    const std::string heads = error_of([&] { nn::gpt(e, {.vocab = 11, .context = 8, .layers = 1, .heads = 3, .width = 8}); });
    CHECK(has(heads, "3 heads do not divide the width 8"));
    const std::string mha = error_of([&] { nn::MultiHeadAttention(e, 10, 4); });
    CHECK(has(mha, "4 heads do not divide the width 10"));
    // The loss's shapes.
    const Tensor logits = Tensor::zeros(e, Shape{2, 7, 11}, Device::cpu(0));
    const std::string targets = error_of([&] { nn::lm_loss(logits, Tensor::zeros(e, Shape{2, 6}, Device::cpu(0))); });
    CHECK(has(targets, "targets"));
    CHECK(has(targets, "[2, 7]"));
    const std::string flat = error_of([&] { nn::lm_loss(logits.reshape(Shape{14, 11}), Tensor::zeros(e, Shape{14}, Device::cpu(0))); });
    CHECK(has(flat, "[B, T, vocab]"));
    // A width the block does not take.
    const std::string width = error_of([&] { (*model)[2].forward(Tensor::zeros(e, Shape{1, 4, 6}, Device::cpu(0))); });
    CHECK(has(width, "[B, T, 8]"));
    e.wait_all();
  });
}

TEST_CASE("gpt: evaluation mode keeps nothing, and saved state moves between micro-batches" * doctest::timeout(120)) {
  weft_optest::for_each_engine([](Engine& e) {
    const nn::GptConfig cfg = small_config();
    auto model = nn::gpt(e, cfg, Device::cpu(0), 2);
    randomize(e, *model);
    const Batch a = make_batch(cfg.vocab, 2, 7, 1), b = make_batch(cfg.vocab, 2, 7, 2);
    // Reference: a then b, each forward followed by its backward, the gradients summed.
    std::map<std::string, std::vector<float>> want;
    for (const Batch* batch : {&a, &b}) {
      forward_backward(e, *model, *batch);
      for (nn::Parameter* p : model->parameters()) {
        std::vector<float> g = p->grad.to_host();
        auto& w = want[p->name];
        if (w.empty()) w.assign(g.size(), 0.0f);
        for (std::size_t i = 0; i < g.size(); ++i) w[i] += g[i];
      }
    }
    // Interleaved: forward a, forward b (a's state taken out), backward b, backward a.
    auto load = [&](const Batch& batch) {
      return std::pair{Tensor::from_host(e, Shape{batch.b, batch.t}, batch.ids, Device::cpu(0)),
                       Tensor::from_host(e, Shape{batch.b, batch.t}, batch.targets, Device::cpu(0))};
    };
    auto [ia, ta] = load(a);
    auto [ib, tb] = load(b);
    ops::SoftmaxCrossEntropy la = nn::lm_loss(model->forward(ia), ta);
    std::any saved_a = model->take_saved();
    ops::SoftmaxCrossEntropy lb = nn::lm_loss(model->forward(ib), tb);
    model->backward(lb.dlogits);
    std::map<std::string, std::vector<float>> got;
    for (nn::Parameter* p : model->parameters()) got[p->name] = p->grad.to_host();
    model->restore_saved(std::move(saved_a));
    model->backward(la.dlogits);
    for (nn::Parameter* p : model->parameters()) {
      std::vector<float> g = p->grad.to_host();
      for (std::size_t i = 0; i < g.size(); ++i) got[p->name][i] += g[i];
      weft_optest::close(got[p->name], weft_optest::dbl(want[p->name]), p->name, 1e-5, 1e-6);
    }
    // Evaluation mode: a forward keeps nothing, so a backward is refused.
    model->train(false);
    model->forward(ia);
    CHECK(has(error_of([&] { model->backward(la.dlogits); }), "backward without a training-mode forward"));
    e.wait_all();
  });
}
