// The transformer layers and the GPT model (weft/nn_transformer.h); the
// design: docs/design/transformer.md.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "layer_util.h"
#include "weft/error.h"
#include "weft/nn.h"

namespace weft::nn {

using namespace layer_util;  // NOLINT(google-build-using-namespace): the layers' shared helpers

namespace {

// U(-a, a) with standard deviation `stddev` (a = stddev * sqrt(3)).
Parameter uniform_weight(Engine& engine, const std::string& name, Shape shape, float stddev, Device device,
                         std::uint64_t seed) {
  const float a = stddev * std::sqrt(3.0f);
  Tensor w = Tensor::uniform(engine, std::move(shape), -a, a, seed, device);
  w.set_name(name + ".weight").set_role(MemoryRole::parameters);
  return Parameter{name + ".weight", std::move(w), Tensor()};
}

// A Dense whose weight starts with standard deviation `stddev` (GPT-2's
// initialization; Dense's own Init choices are fan-based).
std::unique_ptr<Dense> gpt_dense(Engine& engine, std::int64_t in, std::int64_t out, Device device,
                                 std::uint64_t seed, const std::string& name, float stddev) {
  auto d = std::make_unique<Dense>(engine, in, out, device, seed, Init::xavier_uniform, name);
  d->weight().value = uniform_weight(engine, name, Shape{out, in}, stddev, device, derive_seed(seed, 1)).value;
  return d;
}

// [B, T, C] with the given width: the message names the layer and the input.
void check_btc(const std::string& layer, const Shape& x, std::int64_t width) {
  if (x.rank() != 3 || x[2] != width)
    throw InvalidArgument(layer + ": input must be [B, T, " + num(width) + "], got " + x.str());
}

Tensor rows(const Tensor& x) {  // [B, T, C] -> [B*T, C]
  const Shape& s = x.shape();
  return x.reshape(Shape{s[0] * s[1], s[2]});
}

std::vector<Parameter*> gather_params(std::initializer_list<Layer*> layers) {
  std::vector<Parameter*> out;
  for (Layer* l : layers) {
    const std::vector<Parameter*> p = l->parameters();
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

struct KeptTensors {
  std::vector<Tensor> t;
};

}  // namespace

// ---- LayerNorm ------------------------------------------------------------

LayerNorm::LayerNorm(Engine& engine, std::int64_t width, Device device, std::string name, float eps)
    : width_(width), eps_(eps) {
  check_positive("LayerNorm", "width", width);
  if (!(eps > 0.0f)) throw InvalidArgument("LayerNorm " + name + ": eps must be positive, got " + std::to_string(eps));
  Tensor w = Tensor::full(engine, Shape{width}, 1.0f, device);
  w.set_name(name + ".weight").set_role(MemoryRole::parameters);
  weight_ = Parameter{name + ".weight", std::move(w), Tensor()};
  bias_ = make_bias(engine, name, width, device);
}

Shape LayerNorm::output_shape(const Shape& x) const {
  if (x.rank() < 1 || x[x.rank() - 1] != width_)
    throw InvalidArgument(describe() + ": input must be [..., " + num(width_) + "], got " + x.str());
  return x;
}

Tensor LayerNorm::forward(const Tensor& x) {
  check_input(x, [&] { output_shape(x.shape()); });
  ops::LayerNormForward f = ops::layer_norm(x, weight_.value, bias_.value, {.eps = eps_});
  if (training_) {
    x_ = x;
    mean_ = std::move(f.mean);
    rstd_ = std::move(f.rstd);
  } else {
    x_ = mean_ = rstd_ = Tensor();
  }
  return f.y;
}

Tensor LayerNorm::backward(const Tensor& dy) {
  if (!x_.defined()) no_forward(describe());
  check_dy(describe(), dy, x_.shape());
  ops::LayerNormGrads g = ops::layer_norm_backward(x_, as_dtype(dy, x_.dtype()), weight_.value, mean_, rstd_);
  x_ = mean_ = rstd_ = Tensor();
  weight_.grad = master_grad(std::move(g.dweight), weight_.name);
  bias_.grad = master_grad(std::move(g.dbias), bias_.name);
  return std::move(g.dx);
}

std::any LayerNorm::take_saved() {
  return KeptTensors{{std::exchange(x_, Tensor()), std::exchange(mean_, Tensor()), std::exchange(rstd_, Tensor())}};
}

void LayerNorm::restore_saved(std::any saved) {
  KeptTensors k = saved_as<KeptTensors>(saved, "LayerNorm");
  k.t.resize(3);
  x_ = std::move(k.t[0]);
  mean_ = std::move(k.t[1]);
  rstd_ = std::move(k.t[2]);
}

std::string LayerNorm::describe() const { return "LayerNorm(" + num(width_) + ")"; }

// ---- GELU -----------------------------------------------------------------

Tensor GELU::forward(const Tensor& x) {
  check_input(x, [] {});
  x_ = training_ ? x : Tensor();
  return ops::gelu(x);
}

Tensor GELU::backward(const Tensor& dy) {
  if (!x_.defined()) no_forward("GELU");
  check_dy("GELU", dy, x_.shape());
  Tensor dx = ops::gelu_backward(x_, as_dtype(dy, x_.dtype()));
  x_ = Tensor();
  return dx;
}

std::any GELU::take_saved() { return std::exchange(x_, Tensor()); }
void GELU::restore_saved(std::any saved) { x_ = saved_as<Tensor>(saved, "GELU"); }

// ---- Embedding ------------------------------------------------------------

Embedding::Embedding(Engine& engine, std::int64_t vocab, std::int64_t width, Device device, std::uint64_t seed,
                     std::string name, float stddev)
    : vocab_(vocab), width_(width) {
  check_positive("Embedding", "vocab", vocab);
  check_positive("Embedding", "width", width);
  weight_ = uniform_weight(engine, name, Shape{vocab, width}, stddev, device, seed);
}

Shape Embedding::output_shape(const Shape& ids) const {
  if (ids.rank() < 1) throw InvalidArgument(describe() + ": ids must have at least one dimension, got " + ids.str());
  std::vector<std::int64_t> dims = ids.dims();
  dims.push_back(width_);
  return Shape(std::move(dims));
}

Tensor Embedding::forward(const Tensor& ids) {
  check_input(ids, [&] { output_shape(ids.shape()); });
  ids_ = training_ ? ids : Tensor();
  return ops::embedding(weight_.value, ids);
}

void Embedding::add_tied_gradient(const Tensor& g) {
  const Tensor here = g.device() == weight_.value.device() || !weight_.value.defined() ? g : g.copy_to(weight_.value.device());
  tied_grad_ = tied_grad_.defined() ? tied_grad_ + here : here;
}

Tensor Embedding::backward_input(const Tensor& dy) {
  if (!ids_.defined() || dy_.defined()) no_forward(describe());
  check_dy(describe(), dy, output_shape(ids_.shape()));
  dy_ = dy;
  return ops::mul_scalar(ids_, 0.0f);  // ids take no gradient
}

void Embedding::backward_weight() {
  if (!dy_.defined()) no_backward_input(describe());
  Tensor g = ops::embedding_backward(ids_, dy_, vocab_);
  ids_ = dy_ = Tensor();
  if (tied_grad_.defined()) {
    const Tensor tied = tied_grad_.device() == g.device() ? tied_grad_ : tied_grad_.copy_to(g.device());
    g = g + tied;
    tied_grad_ = Tensor();
  }
  weight_.grad = master_grad(std::move(g), weight_.name);
}

Tensor Embedding::backward(const Tensor& dy) {
  Tensor dx = backward_input(dy);
  backward_weight();
  return dx;
}

std::any Embedding::take_saved() { return KeptTensors{{std::exchange(ids_, Tensor()), std::exchange(dy_, Tensor())}}; }

void Embedding::restore_saved(std::any saved) {
  KeptTensors k = saved_as<KeptTensors>(saved, "Embedding");
  k.t.resize(2);
  ids_ = std::move(k.t[0]);
  dy_ = std::move(k.t[1]);
}

std::string Embedding::describe() const { return "Embedding(" + num(vocab_) + ", " + num(width_) + ")"; }

// ---- PositionalEmbedding --------------------------------------------------

PositionalEmbedding::PositionalEmbedding(Engine& engine, std::int64_t context, std::int64_t width, Device device,
                                         std::uint64_t seed, std::string name, float stddev)
    : context_(context), width_(width) {
  check_positive("PositionalEmbedding", "context", context);
  check_positive("PositionalEmbedding", "width", width);
  weight_ = uniform_weight(engine, name, Shape{context, width}, stddev, device, seed);
}

Shape PositionalEmbedding::output_shape(const Shape& x) const {
  check_btc(describe(), x, width_);
  if (x[1] > context_)
    throw InvalidArgument(describe() + ": a sequence of " + num(x[1]) + " positions is longer than the context, " +
                          num(context_) + " (input " + x.str() + ")");
  return x;
}

Tensor PositionalEmbedding::positions(std::int64_t batch, std::int64_t seq, Device device) {
  if (pos_.defined() && pos_.shape() == Shape{batch, seq} && pos_.device() == device) return pos_;
  std::vector<float> ids(static_cast<std::size_t>(batch * seq));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>(static_cast<std::int64_t>(i) % seq);
  pos_ = Tensor::from_host(weight_.value.engine(), Shape{batch, seq}, ids, device);
  pos_.set_name(weight_.name + " positions");
  return pos_;
}

Tensor PositionalEmbedding::forward(const Tensor& x) {
  check_input(x, [&] { output_shape(x.shape()); });
  const Tensor pos = positions(x.shape()[0], x.shape()[1], x.device());
  saved_pos_ = training_ ? pos : Tensor();
  return x + as_dtype(ops::embedding(weight_.value, pos), x.dtype());
}

Tensor PositionalEmbedding::backward_input(const Tensor& dy) {
  if (!saved_pos_.defined() || dy_.defined()) no_forward(describe());
  const Shape& p = saved_pos_.shape();
  check_dy(describe(), dy, Shape{p[0], p[1], width_});
  dy_ = dy;
  return dy;
}

void PositionalEmbedding::backward_weight() {
  if (!dy_.defined()) no_backward_input(describe());
  Tensor g = ops::embedding_backward(saved_pos_, dy_, context_);
  saved_pos_ = dy_ = Tensor();
  weight_.grad = master_grad(std::move(g), weight_.name);
}

Tensor PositionalEmbedding::backward(const Tensor& dy) {
  Tensor dx = backward_input(dy);
  backward_weight();
  return dx;
}

std::any PositionalEmbedding::take_saved() {
  return KeptTensors{{std::exchange(saved_pos_, Tensor()), std::exchange(dy_, Tensor())}};
}

void PositionalEmbedding::restore_saved(std::any saved) {
  KeptTensors k = saved_as<KeptTensors>(saved, "PositionalEmbedding");
  k.t.resize(2);
  saved_pos_ = std::move(k.t[0]);
  dy_ = std::move(k.t[1]);
}

std::string PositionalEmbedding::describe() const {
  return "PositionalEmbedding(" + num(context_) + ", " + num(width_) + ")";
}

// ---- MultiHeadAttention ---------------------------------------------------

struct MultiHeadAttention::Saved {
  Tensor q, k, v, out, lse;
  Shape x;  // the input's [B, T, C]
};

MultiHeadAttention::MultiHeadAttention(Engine& engine, std::int64_t width, std::int64_t heads, Device device,
                                       std::uint64_t seed, std::string name, float stddev, float proj_stddev)
    : width_(width), heads_(heads), saved_(std::make_unique<Saved>()) {
  check_positive("MultiHeadAttention", "width", width);
  check_positive("MultiHeadAttention", "heads", heads);
  if (width % heads != 0)
    throw InvalidArgument("MultiHeadAttention " + name + ": " + num(heads) + " heads do not divide the width " +
                          num(width) + " (each head takes width / heads)");
  c_attn_ = gpt_dense(engine, width, 3 * width, device, derive_seed(seed, 0), name + ".c_attn", stddev);
  c_proj_ = gpt_dense(engine, width, width, device, derive_seed(seed, 1), name + ".c_proj", proj_stddev);
}

MultiHeadAttention::~MultiHeadAttention() = default;

Shape MultiHeadAttention::output_shape(const Shape& x) const {
  check_btc(describe(), x, width_);
  return x;
}

std::vector<Parameter*> MultiHeadAttention::parameters() { return gather_params({c_attn_.get(), c_proj_.get()}); }

void MultiHeadAttention::train(bool on) {
  Layer::train(on);
  c_attn_->train(on);
  c_proj_->train(on);
}

void MultiHeadAttention::set_precision(Precision p) {
  Layer::set_precision(p);
  c_attn_->set_precision(p);
  c_proj_->set_precision(p);
}

Tensor MultiHeadAttention::forward(const Tensor& x) {
  check_input(x, [&] { output_shape(x.shape()); });
  const std::int64_t b = x.shape()[0], t = x.shape()[1], h = heads_, d = width_ / heads_;
  // [B*T, 3C] = [B, T, 3, H, D] -> [3, B, H, T, D]: q, k and v contiguous.
  const Tensor qkv = ops::permute(c_attn_->forward(rows(x)).reshape(Shape{b, t, 3, h, d}), {2, 0, 3, 1, 4});
  const std::int64_t n = b * h * t * d;
  const Shape head_shape{b, h, t, d};
  Tensor q = qkv.view(0, head_shape), k = qkv.view(n, head_shape), v = qkv.view(2 * n, head_shape);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ops::CausalAttention a = ops::causal_attention(q, k, v, scale);
  // [B, H, T, D] -> [B, T, H, D] = [B*T, C]
  const Tensor merged = ops::permute(a.out, {0, 2, 1, 3}).reshape(Shape{b * t, width_});
  if (training_)
    *saved_ = Saved{std::move(q), std::move(k), std::move(v), std::move(a.out), std::move(a.lse), x.shape()};
  else
    *saved_ = Saved{};
  return c_proj_->forward(merged).reshape(Shape{b, t, width_});
}

Tensor MultiHeadAttention::backward_input(const Tensor& dy) {
  Saved& s = *saved_;
  if (!s.q.defined()) no_forward(describe());
  check_dy(describe(), dy, s.x);
  const std::int64_t b = s.x[0], t = s.x[1], h = heads_, d = width_ / heads_;
  const Tensor d_merged = c_proj_->backward_input(rows(dy));
  const Tensor dout = ops::permute(d_merged.reshape(Shape{b, t, h, d}), {0, 2, 1, 3});
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ops::CausalAttentionGrads g =
      ops::causal_attention_backward(s.q, s.k, s.v, s.out, as_dtype(dout, s.out.dtype()), s.lse, scale);
  s.q = s.k = s.v = s.out = s.lse = Tensor();
  Tensor stacked = Tensor::empty(dy.engine(), Shape{3 * b * h * t * d}, dy.device(), g.dq.dtype());
  ops::pack({g.dq, g.dk, g.dv}, stacked);
  // [3, B, H, T, D] -> [B, T, 3, H, D] = [B*T, 3C]
  const Tensor dqkv = ops::permute(stacked.reshape(Shape{3, b, h, t, d}), {1, 3, 0, 2, 4}).reshape(Shape{b * t, 3 * width_});
  return c_attn_->backward_input(dqkv).reshape(s.x);
}

void MultiHeadAttention::backward_weight() {
  c_proj_->backward_weight();
  c_attn_->backward_weight();
}

Tensor MultiHeadAttention::backward(const Tensor& dy) {
  Tensor dx = backward_input(dy);
  backward_weight();
  return dx;
}

std::any MultiHeadAttention::take_saved() {
  std::vector<std::any> parts{std::exchange(*saved_, Saved{}), c_attn_->take_saved(), c_proj_->take_saved()};
  return parts;
}

void MultiHeadAttention::restore_saved(std::any saved) {
  std::vector<std::any> parts = saved_as<std::vector<std::any>>(saved, "MultiHeadAttention");
  if (parts.empty()) parts.resize(3);
  if (parts.size() != 3) throw InvalidArgument("MultiHeadAttention::restore_saved: saved by another layer");
  *saved_ = saved_as<Saved>(parts[0], "MultiHeadAttention");
  c_attn_->restore_saved(std::move(parts[1]));
  c_proj_->restore_saved(std::move(parts[2]));
}

std::string MultiHeadAttention::describe() const {
  return "MultiHeadAttention(width " + num(width_) + ", heads " + num(heads_) + ", causal)";
}

// ---- TransformerBlock -----------------------------------------------------

TransformerBlock::TransformerBlock(Engine& engine, std::int64_t width, std::int64_t heads, Device device,
                                   std::uint64_t seed, std::string name, float stddev, float proj_stddev, float eps)
    : width_(width), heads_(heads) {
  check_positive("TransformerBlock", "width", width);
  ln_1_ = std::make_unique<LayerNorm>(engine, width, device, name + ".ln_1", eps);
  attn_ = std::make_unique<MultiHeadAttention>(engine, width, heads, device, derive_seed(seed, 0), name + ".attn",
                                               stddev, proj_stddev);
  ln_2_ = std::make_unique<LayerNorm>(engine, width, device, name + ".ln_2", eps);
  c_fc_ = gpt_dense(engine, width, 4 * width, device, derive_seed(seed, 1), name + ".mlp.c_fc", stddev);
  c_proj_ = gpt_dense(engine, 4 * width, width, device, derive_seed(seed, 2), name + ".mlp.c_proj", proj_stddev);
}

TransformerBlock::~TransformerBlock() = default;

std::vector<Layer*> TransformerBlock::children() const {
  return {ln_1_.get(), attn_.get(), ln_2_.get(), c_fc_.get(), const_cast<GELU*>(&gelu_), c_proj_.get()};
}

Shape TransformerBlock::output_shape(const Shape& x) const {
  check_btc(describe(), x, width_);
  return x;
}

std::vector<Parameter*> TransformerBlock::parameters() {
  return gather_params({ln_1_.get(), attn_.get(), ln_2_.get(), c_fc_.get(), c_proj_.get()});
}

void TransformerBlock::train(bool on) {
  Layer::train(on);
  for (Layer* l : children()) l->train(on);
}

void TransformerBlock::set_precision(Precision p) {
  Layer::set_precision(p);
  for (Layer* l : children()) l->set_precision(p);
}

Tensor TransformerBlock::forward(const Tensor& x) {
  check_input(x, [&] { output_shape(x.shape()); });
  residual_dtype_ = x.dtype();
  const Tensor x1 = x + as_dtype(attn_->forward(ln_1_->forward(x)), x.dtype());
  const Tensor m = c_proj_->forward(gelu_.forward(c_fc_->forward(rows(ln_2_->forward(x1)))));
  return x1 + as_dtype(m, x.dtype()).reshape(x.shape());
}

Tensor TransformerBlock::backward_input(const Tensor& dy) {
  const Shape shape = dy.shape();
  const Tensor d_mlp = c_fc_->backward_input(gelu_.backward(c_proj_->backward_input(rows(dy))));
  const Tensor dx1 = dy + as_dtype(ln_2_->backward(d_mlp.reshape(shape)), residual_dtype_);
  return dx1 + as_dtype(ln_1_->backward(attn_->backward_input(dx1)), residual_dtype_);
}

void TransformerBlock::backward_weight() {
  c_proj_->backward_weight();
  c_fc_->backward_weight();
  attn_->backward_weight();
}

Tensor TransformerBlock::backward(const Tensor& dy) {
  Tensor dx = backward_input(dy);
  backward_weight();
  return dx;
}

std::any TransformerBlock::take_saved() {
  std::vector<std::any> saved;
  for (Layer* l : children()) saved.push_back(l->take_saved());
  return saved;
}

void TransformerBlock::restore_saved(std::any saved) {
  std::vector<std::any> parts = saved_as<std::vector<std::any>>(saved, "TransformerBlock");
  const std::vector<Layer*> layers = children();
  if (parts.empty()) parts.resize(layers.size());
  if (parts.size() != layers.size()) throw InvalidArgument("TransformerBlock::restore_saved: saved by another layer");
  for (std::size_t i = 0; i < layers.size(); ++i) layers[i]->restore_saved(std::move(parts[i]));
}

std::string TransformerBlock::describe() const {
  return "TransformerBlock(width " + num(width_) + ", heads " + num(heads_) + ")";
}

// ---- LMHead ---------------------------------------------------------------

LMHead::LMHead(Embedding& tied, std::string name)
    : tied_(&tied), width_(tied.width()), vocab_(tied.vocab()), name_(std::move(name)) {}

LMHead::LMHead(Engine& engine, std::int64_t width, std::int64_t vocab, Device device, std::uint64_t seed,
               std::string name, float stddev)
    : width_(width), vocab_(vocab), name_(std::move(name)) {
  check_positive("LMHead", "width", width);
  check_positive("LMHead", "vocab", vocab);
  own_ = uniform_weight(engine, name_, Shape{vocab, width}, stddev, device, seed);
}

const Parameter& LMHead::weight() const { return tied_ ? tied_->weight() : own_; }

std::vector<Parameter*> LMHead::parameters() {
  if (tied_) return {};
  return {&own_};
}

std::vector<Parameter*> LMHead::tied_parameters() {
  if (!tied_) return {};
  return {&tied_->weight()};
}

Shape LMHead::output_shape(const Shape& x) const {
  check_btc(describe(), x, width_);
  return Shape{x[0], x[1], vocab_};
}

Tensor LMHead::forward(const Tensor& x) {
  check_input(x, [&] { output_shape(x.shape()); });
  const DType dtype = compute_dtype(precision_);
  MathScope math(precision_);
  Tensor w = weight().value;
  if (!w.defined())
    throw InvalidArgument(describe() + ": the weight '" + weight().name + "' is not there (freed between uses)");
  if (w.device() != x.device()) w = w.copy_to(x.device());  // tied across devices (a pipeline's first and last stage)
  const Tensor xc = as_dtype(rows(x), dtype), wc = as_dtype(w, dtype);
  const Tensor y = ops::matmul(xc, wc, false, true);
  out_ = Shape{x.shape()[0], x.shape()[1], vocab_};
  if (training_) {
    x_ = xc;
    w_ = wc.storage() == weight().value.storage() ? Tensor() : wc;  // a copy (half, or on this device) is kept
  } else {
    x_ = w_ = Tensor();
  }
  return y.reshape(Shape{x.shape()[0], x.shape()[1], vocab_});
}

Tensor LMHead::backward_input(const Tensor& dy) {
  if (!x_.defined() || dy_.defined()) no_forward(describe());
  const std::int64_t n = x_.shape()[0];
  check_dy(describe(), dy, out_);
  MathScope math(precision_);
  Tensor w = weight_for_backward(w_, weight().value);
  if (w.device() != x_.device()) w = w.copy_to(x_.device());
  w = as_dtype(w, x_.dtype());
  const Tensor dy2 = as_dtype(dy, x_.dtype()).reshape(Shape{n, vocab_});
  const Tensor dx = ops::matmul(dy2, w).reshape(Shape{out_[0], out_[1], width_});
  if (tied_) {
    // The weight's gradient now, not in backward_weight: it must reach the
    // embedding before the embedding's own backward, whatever a schedule
    // defers.
    tied_->add_tied_gradient(master_grad(ops::matmul(dy2, x_, true, false), tied_->weight().name));
    x_ = w_ = Tensor();
  } else {
    dy_ = dy2;
  }
  return dx;
}

void LMHead::backward_weight() {
  if (tied_) return;
  if (!dy_.defined()) no_backward_input(describe());
  MathScope math(precision_);
  own_.grad = master_grad(ops::matmul(dy_, x_, true, false), own_.name);
  x_ = w_ = dy_ = Tensor();
}

Tensor LMHead::backward(const Tensor& dy) {
  Tensor dx = backward_input(dy);
  backward_weight();
  return dx;
}

std::any LMHead::take_saved() {
  std::vector<std::any> parts{std::exchange(x_, Tensor()), std::exchange(w_, Tensor()), std::exchange(dy_, Tensor()),
                              out_};
  return parts;
}

void LMHead::restore_saved(std::any saved) {
  std::vector<std::any> k = saved_as<std::vector<std::any>>(saved, "LMHead");
  if (k.empty()) {
    x_ = w_ = dy_ = Tensor();
    return;
  }
  if (k.size() != 4) throw InvalidArgument("LMHead::restore_saved: saved by another layer");
  x_ = saved_as<Tensor>(k[0], "LMHead");
  w_ = saved_as<Tensor>(k[1], "LMHead");
  dy_ = saved_as<Tensor>(k[2], "LMHead");
  out_ = saved_as<Shape>(k[3], "LMHead");
}

std::string LMHead::describe() const {
  return "LMHead(" + num(width_) + " -> " + num(vocab_) + (tied_ ? ", tied to " + tied_->weight().name : "") + ")";
}

// ---- GPT ------------------------------------------------------------------

GptConfig GptConfig::small() { return GptConfig{}; }

GptConfig GptConfig::tiny() {
  return GptConfig{.vocab = 256, .context = 128, .layers = 4, .heads = 4, .width = 128};
}

std::string GptConfig::describe() const {
  return "layers " + num(layers) + ", heads " + num(heads) + ", width " + num(width) + ", context " + num(context) +
         ", vocab " + num(vocab) + (tie_weights ? "" : ", untied");
}

std::unique_ptr<Sequential> gpt(Engine& engine, const GptConfig& c, Device device, std::uint64_t seed) {
  for (auto [what, v] : {std::pair{"vocab", c.vocab}, {"context", c.context}, {"layers", c.layers},
                         {"heads", c.heads}, {"width", c.width}})
    if (v < 1) throw InvalidArgument(std::string("gpt: ") + what + " must be positive, got " + num(v) + " (" + c.describe() + ")");
  if (c.width % c.heads != 0)
    throw InvalidArgument("gpt: " + num(c.heads) + " heads do not divide the width " + num(c.width) + " (" +
                          c.describe() + ")");
  const float stddev = 0.02f;
  const float proj_stddev = stddev / std::sqrt(2.0f * static_cast<float>(c.layers));
  auto model = std::make_unique<Sequential>();
  std::uint64_t index = 0;
  auto& wte = model->emplace<Embedding>(engine, c.vocab, c.width, device, derive_seed(seed, index++), "wte", stddev);
  model->emplace<PositionalEmbedding>(engine, c.context, c.width, device, derive_seed(seed, index++), "wpe", stddev);
  for (std::int64_t i = 0; i < c.layers; ++i)
    model->emplace<TransformerBlock>(engine, c.width, c.heads, device, derive_seed(seed, index++), "h." + num(i),
                                     stddev, proj_stddev, c.layer_norm_eps);
  model->emplace<LayerNorm>(engine, c.width, device, "ln_f", c.layer_norm_eps);
  ++index;
  if (c.tie_weights)
    model->emplace<LMHead>(wte, "lm_head");
  else
    model->emplace<LMHead>(engine, c.width, c.vocab, device, derive_seed(seed, index), "lm_head", stddev);
  model->set_input_shape(Shape{1, c.context});
  return model;
}

ops::SoftmaxCrossEntropy lm_loss(const Tensor& logits, const Tensor& targets) {
  if (!logits.defined() || !targets.defined()) throw InvalidArgument("lm_loss: undefined logits or targets");
  const Shape& s = logits.shape();
  if (s.rank() != 3)
    throw InvalidArgument("lm_loss: logits must be [B, T, vocab], got " + logits.str());
  if (targets.shape() != Shape{s[0], s[1]})
    throw InvalidArgument("lm_loss: targets " + targets.str() + " do not match logits " + logits.str() +
                          " (want [B, T] = " + Shape{s[0], s[1]}.str() + ")");
  const Tensor flat = as_dtype(logits, DType::float32).reshape(Shape{s[0] * s[1], s[2]});
  ops::SoftmaxCrossEntropy l = ops::softmax_cross_entropy(flat, targets.reshape(Shape{s[0] * s[1]}));
  l.dlogits = l.dlogits.reshape(s);
  return l;
}

}  // namespace weft::nn
