// The nn layers: each forward/backward pushes the matching op(s) of
// weft/nn_ops.h and returns at once.
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>

#include "describe.h"
#include "layer_util.h"
#include "weft/error.h"
#include "weft/nn.h"

namespace weft::nn {

using namespace layer_util;  // NOLINT(google-build-using-namespace): the layers' shared helpers

namespace {

Shape pool_output(const char* layer, const Shape& x, Pool2dParams p) {
  if (x.rank() != 4) throw InvalidArgument(std::string(layer) + ": input must be [N, C, H, W], got " + x.str());
  const std::int64_t h = x[2] + 2 * p.pad, w = x[3] + 2 * p.pad;
  if (p.kernel < 1 || p.stride < 1 || p.pad < 0 || 2 * p.pad > p.kernel || p.kernel > h || p.kernel > w)
    throw InvalidArgument(std::string(layer) + ": window " + num(p.kernel) + " stride " + num(p.stride) + " pad " +
                          num(p.pad) + " does not fit input " + x.str());
  return Shape{x[0], x[1], (h - p.kernel) / p.stride + 1, (w - p.kernel) / p.stride + 1};
}

std::string pool_describe(const char* layer, Pool2dParams p) {
  std::string out = std::string(layer) + "(kernel " + num(p.kernel) + ", stride " + num(p.stride);
  if (p.pad) out += ", pad " + num(p.pad);
  return out + ")";
}

// What a layer with an input and a pending dy keeps (Dense, Conv2d).
struct InputAndGrad {
  Tensor x, dy, w;  // w: the weight copy forward computed with
};
// What a shape-only layer keeps (average pooling, flatten).
struct KeptShape {
  Shape shape;
  bool have = false;
};

Buffer make_buffer(Engine& engine, const std::string& name, std::int64_t n, float value, Device device) {
  Tensor t = Tensor::full(engine, Shape{n}, value, device);
  t.set_name(name).set_role(MemoryRole::parameters);
  return Buffer{name, std::move(t)};
}

}  // namespace

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t index) noexcept {
  // SplitMix64 over seed and index, two rounds so (seed, index) and
  // (seed + 1, index - 1) differ.
  auto mix = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(seed) ^ (index * 0xd1b54a32d192ed03ULL + 1));
}

Layer::~Layer() = default;

std::vector<Parameter*> Layer::parameters() { return {}; }
std::vector<Buffer*> Layer::buffers() { return {}; }
std::vector<Parameter*> Layer::tied_parameters() { return {}; }

// ---- precision ------------------------------------------------------------

namespace {

// A layer under channels_last converts a contiguous 4-D input (the model's
// input, once: the ops keep the format after); otherwise x as it comes.
Tensor in_layer_format(const Tensor& x, MemoryFormat layer) {
  if (layer != MemoryFormat::channels_last || !x.defined() || x.shape().rank() != 4) return x;
  return ops::to_memory_format(x, layer);
}





}  // namespace

// ---- Dense --------------------------------------------------------------

Dense::Dense(Engine& engine, std::int64_t in, std::int64_t out, Device device, std::uint64_t seed, Init init,
             std::string name)
    : in_(in), out_(out) {
  check_positive("Dense", "in", in);
  check_positive("Dense", "out", out);
  weight_ = make_weight(engine, name, Shape{out, in}, init, in, out, device, seed);
  bias_ = make_bias(engine, name, out, device);
}

Shape Dense::output_shape(const Shape& x) const {
  if (x.rank() != 2 || x[1] != in_)
    throw InvalidArgument("Dense(" + num(in_) + " -> " + num(out_) + "): input must be [N, " + num(in_) + "], got " + x.str());
  return Shape{x[0], out_};
}

Tensor Dense::forward(const Tensor& x) {
  check_input(x, [&] { output_shape(x.shape()); });
  const DType dtype = compute_dtype(precision_);
  MathScope math(precision_);
  Tensor xc = as_dtype(x, dtype), wc = as_dtype(weight_.value, dtype);
  Tensor y = ops::dense(xc, wc, as_dtype(bias_.value, dtype));
  x_ = training_ ? xc : Tensor();
  w_ = training_ ? half_copy(wc, weight_.value) : Tensor();
  return y;
}

Tensor Dense::backward(const Tensor& dy) {
  if (!x_.defined()) no_forward("Dense");
  check_dy("Dense", dy, output_shape(x_.shape()));
  MathScope math(precision_);
  ops::DenseGrads g = ops::dense_backward(x_, weight_for_backward(w_, weight_.value), as_dtype(dy, x_.dtype()));
  x_ = w_ = Tensor();
  weight_.grad = master_grad(std::move(g.dw), weight_.name);
  bias_.grad = master_grad(std::move(g.db), bias_.name);
  return std::move(g.dx);
}

Tensor Dense::backward_input(const Tensor& dy) {
  if (!x_.defined() || dy_.defined()) no_forward("Dense");
  check_dy("Dense", dy, output_shape(x_.shape()));
  MathScope math(precision_);
  dy_ = as_dtype(dy, x_.dtype());
  return ops::dense_backward_data(dy_, weight_for_backward(w_, weight_.value));
}

void Dense::backward_weight() {
  if (!dy_.defined()) no_backward_input("Dense");
  MathScope math(precision_);
  ops::DenseWeightGrads g = ops::dense_backward_weight(x_, dy_);
  x_ = w_ = dy_ = Tensor();
  weight_.grad = master_grad(std::move(g.dw), weight_.name);
  bias_.grad = master_grad(std::move(g.db), bias_.name);
}

std::any Dense::take_saved() {
  return InputAndGrad{std::exchange(x_, Tensor()), std::exchange(dy_, Tensor()), std::exchange(w_, Tensor())};
}

void Dense::restore_saved(std::any saved) {
  InputAndGrad k = saved_as<InputAndGrad>(saved, "Dense");
  x_ = std::move(k.x);
  dy_ = std::move(k.dy);
  w_ = std::move(k.w);
}

std::string Dense::describe() const { return "Dense(" + num(in_) + " -> " + num(out_) + ")"; }

// ---- Conv2d -------------------------------------------------------------

Conv2d::Conv2d(Engine& engine, std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel,
               Conv2dParams params, Device device, std::uint64_t seed, Init init, std::string name, bool bias)
    : in_(in_channels), out_(out_channels), kernel_(kernel), params_(params), has_bias_(bias) {
  check_positive("Conv2d", "in_channels", in_channels);
  check_positive("Conv2d", "out_channels", out_channels);
  check_positive("Conv2d", "kernel", kernel);
  check_positive("Conv2d", "stride", params.stride);
  if (params.pad < 0) throw InvalidArgument("Conv2d: pad must not be negative, got " + num(params.pad));
  const std::int64_t k2 = kernel * kernel;
  weight_ = make_weight(engine, name, Shape{out_channels, in_channels, kernel, kernel}, init, in_channels * k2,
                        out_channels * k2, device, seed);
  if (bias) bias_ = make_bias(engine, name, out_channels, device);
}

std::vector<Parameter*> Conv2d::parameters() {
  if (!has_bias_) return {&weight_};
  return {&weight_, &bias_};
}

Shape Conv2d::output_shape(const Shape& x) const {
  if (x.rank() != 4 || x[1] != in_)
    throw InvalidArgument(describe() + ": input must be [N, " + num(in_) + ", H, W], got " + x.str());
  const std::int64_t h = x[2] + 2 * params_.pad, w = x[3] + 2 * params_.pad;
  if (h < kernel_ || w < kernel_) throw InvalidArgument(describe() + ": input " + x.str() + " is smaller than the filter");
  return Shape{x[0], out_, (h - kernel_) / params_.stride + 1, (w - kernel_) / params_.stride + 1};
}

Tensor Conv2d::forward(const Tensor& x_in) {
  check_input(x_in, [&] { output_shape(x_in.shape()); });
  const Tensor x = in_layer_format(x_in, memory_format_);
  const DType dtype = compute_dtype(precision_);
  MathScope math(precision_);
  Tensor xc = as_dtype(x, dtype), wc = as_dtype(weight_.value, dtype);
  Tensor y = ops::conv2d(xc, wc, as_dtype(bias_.value, dtype), params_);
  x_ = training_ ? xc : Tensor();
  w_ = training_ ? half_copy(wc, weight_.value) : Tensor();
  return y;
}

Tensor Conv2d::backward(const Tensor& dy) {
  if (!x_.defined()) no_forward("Conv2d");
  check_dy("Conv2d", dy, output_shape(x_.shape()));
  MathScope math(precision_);
  const Tensor dyc = as_dtype(dy, x_.dtype());
  Tensor dx = ops::conv2d_backward_data(dyc, weight_for_backward(w_, weight_.value), x_.shape(), params_);
  ops::ConvFilterGrads g = ops::conv2d_backward_filter(x_, dyc, Shape{out_, in_, kernel_, kernel_}, params_);
  x_ = w_ = Tensor();
  weight_.grad = master_grad(std::move(g.dw), weight_.name);
  if (has_bias_) bias_.grad = master_grad(std::move(g.db), bias_.name);
  return dx;
}

Tensor Conv2d::backward_input(const Tensor& dy) {
  if (!x_.defined() || dy_.defined()) no_forward("Conv2d");
  check_dy("Conv2d", dy, output_shape(x_.shape()));
  MathScope math(precision_);
  dy_ = as_dtype(dy, x_.dtype());
  return ops::conv2d_backward_data(dy_, weight_for_backward(w_, weight_.value), x_.shape(), params_);
}

void Conv2d::backward_weight() {
  if (!dy_.defined()) no_backward_input("Conv2d");
  MathScope math(precision_);
  ops::ConvFilterGrads g = ops::conv2d_backward_filter(x_, dy_, Shape{out_, in_, kernel_, kernel_}, params_);
  x_ = w_ = dy_ = Tensor();
  weight_.grad = master_grad(std::move(g.dw), weight_.name);
  if (has_bias_) bias_.grad = master_grad(std::move(g.db), bias_.name);
}

std::any Conv2d::take_saved() {
  return InputAndGrad{std::exchange(x_, Tensor()), std::exchange(dy_, Tensor()), std::exchange(w_, Tensor())};
}

void Conv2d::restore_saved(std::any saved) {
  InputAndGrad k = saved_as<InputAndGrad>(saved, "Conv2d");
  x_ = std::move(k.x);
  dy_ = std::move(k.dy);
  w_ = std::move(k.w);
}

std::string Conv2d::describe() const {
  return "Conv2d(" + num(in_) + " -> " + num(out_) + ", kernel " + num(kernel_) + ", stride " + num(params_.stride) +
         ", pad " + num(params_.pad) + (has_bias_ ? ")" : ", no bias)");
}

// ---- ReLU ---------------------------------------------------------------

Tensor ReLU::forward(const Tensor& x) {
  Tensor y = ops::relu(x);
  x_ = training_ ? x : Tensor();
  return y;
}

Tensor ReLU::backward(const Tensor& dy) {
  if (!x_.defined()) no_forward("ReLU");
  check_dy("ReLU", dy, x_.shape());
  Tensor dx = ops::relu_grad(x_, as_dtype(dy, x_.dtype()));
  x_ = Tensor();
  return dx;
}

std::any ReLU::take_saved() { return std::exchange(x_, Tensor()); }
void ReLU::restore_saved(std::any saved) { x_ = saved_as<Tensor>(saved, "ReLU"); }

// ---- pooling ------------------------------------------------------------

Shape AvgPool2d::output_shape(const Shape& x) const { return pool_output("AvgPool2d", x, params_); }

Tensor AvgPool2d::forward(const Tensor& x_in) {
  const Tensor x = in_layer_format(x_in, memory_format_);
  Tensor y = ops::avg_pool2d(x, params_);
  x_shape_ = x.shape();
  have_x_ = training_;
  return y;
}

Tensor AvgPool2d::backward(const Tensor& dy) {
  if (!have_x_) no_forward("AvgPool2d");
  check_dy("AvgPool2d", dy, output_shape(x_shape_));
  have_x_ = false;
  return ops::avg_pool2d_backward(dy, x_shape_, params_);
}

std::string AvgPool2d::describe() const { return pool_describe("AvgPool2d", params_); }

std::any AvgPool2d::take_saved() { return KeptShape{x_shape_, std::exchange(have_x_, false)}; }

void AvgPool2d::restore_saved(std::any saved) {
  const KeptShape k = saved_as<KeptShape>(saved, "AvgPool2d");
  x_shape_ = k.shape;
  have_x_ = k.have;
}

Shape MaxPool2d::output_shape(const Shape& x) const { return pool_output("MaxPool2d", x, params_); }

Tensor MaxPool2d::forward(const Tensor& x_in) {
  const Tensor x = in_layer_format(x_in, memory_format_);
  Tensor y = ops::max_pool2d(x, params_);
  x_ = training_ ? x : Tensor();
  return y;
}

Tensor MaxPool2d::backward(const Tensor& dy) {
  if (!x_.defined()) no_forward("MaxPool2d");
  check_dy("MaxPool2d", dy, output_shape(x_.shape()));
  Tensor dx = ops::max_pool2d_backward(x_, as_dtype(dy, x_.dtype()), params_);
  x_ = Tensor();
  return dx;
}

std::string MaxPool2d::describe() const { return pool_describe("MaxPool2d", params_); }

std::any MaxPool2d::take_saved() { return std::exchange(x_, Tensor()); }
void MaxPool2d::restore_saved(std::any saved) { x_ = saved_as<Tensor>(saved, "MaxPool2d"); }

std::any GlobalAvgPool2d::take_saved() { return KeptShape{x_shape_, std::exchange(have_x_, false)}; }

void GlobalAvgPool2d::restore_saved(std::any saved) {
  const KeptShape k = saved_as<KeptShape>(saved, "GlobalAvgPool2d");
  x_shape_ = k.shape;
  have_x_ = k.have;
}

// ---- GlobalAvgPool2d ------------------------------------------------------

Shape GlobalAvgPool2d::output_shape(const Shape& x) const {
  if (x.rank() != 4) throw InvalidArgument("GlobalAvgPool2d: input must be [N, C, H, W], got " + x.str());
  return Shape{x[0], x[1], 1, 1};
}

Tensor GlobalAvgPool2d::forward(const Tensor& x) {
  check_input(x, [&] { output_shape(x.shape()); });
  const Tensor xf = in_layer_format(x, memory_format_);
  Tensor y = ops::global_avg_pool2d(xf);
  x_shape_ = x.shape();
  x_format_ = xf.memory_format();
  have_x_ = training_;
  return y;
}

Tensor GlobalAvgPool2d::backward(const Tensor& dy) {
  if (!have_x_) no_forward("GlobalAvgPool2d");
  check_dy("GlobalAvgPool2d", dy, output_shape(x_shape_));
  have_x_ = false;
  return ops::global_avg_pool2d_backward(dy, x_shape_, x_format_);
}

// ---- BatchNorm ------------------------------------------------------------

BatchNorm::BatchNorm(Engine& engine, std::int64_t channels, Device device, std::string name, BatchNormParams params)
    : channels_(channels), params_(params), name_(name) {
  check_positive("BatchNorm", "channels", channels);
  if (!(params.eps > 0.0f) || !std::isfinite(params.eps))
    throw InvalidArgument("BatchNorm: eps must be a positive number, got " + std::to_string(params.eps));
  if (!(params.momentum >= 0.0f && params.momentum <= 1.0f))
    throw InvalidArgument("BatchNorm: momentum must be in [0, 1], got " + std::to_string(params.momentum));
  Tensor gamma = Tensor::ones(engine, Shape{channels}, device);
  gamma.set_name(name + ".weight").set_role(MemoryRole::parameters);
  weight_ = Parameter{name + ".weight", std::move(gamma), Tensor()};
  bias_ = make_bias(engine, name, channels, device);
  running_mean_ = make_buffer(engine, name + ".running_mean", channels, 0.0f, device);
  running_var_ = make_buffer(engine, name + ".running_var", channels, 1.0f, device);
}

Shape BatchNorm::output_shape(const Shape& x) const {
  if ((x.rank() != 4 && x.rank() != 2) || x[1] != channels_)
    throw InvalidArgument(describe() + ": input must be [N, " + num(channels_) + ", H, W] or [N, " + num(channels_) +
                          "], got " + x.str());
  return x;
}

Tensor BatchNorm::forward(const Tensor& x_in) {
  check_input(x_in, [&] { output_shape(x_in.shape()); });
  const Tensor x = in_layer_format(x_in, memory_format_);
  if (!training_) {
    x_ = save_mean_ = save_invstd_ = Tensor();
    return ops::batch_norm_infer(x, weight_.value, bias_.value, running_mean_.value, running_var_.value, params_);
  }
  ops::BatchNormTrain r;
  ops::BatchNormParams p = params_;
  if (frozen_) p.momentum = 0.0f;  // running = 1 * running + 0 * batch: unchanged
  try {
    r = ops::batch_norm_train(x, weight_.value, bias_.value, running_mean_.value, running_var_.value, p);
  } catch (const Error& e) {
    throw InvalidArgument(name_ + " (" + describe() + "): " + e.what());
  }
  x_ = x;
  save_mean_ = std::move(r.save_mean);
  save_invstd_ = std::move(r.save_invstd);
  return std::move(r.y);
}

Tensor BatchNorm::backward(const Tensor& dy) {
  if (!x_.defined()) no_forward("BatchNorm");
  check_dy("BatchNorm", dy, x_.shape());
  ops::BatchNormGrads g =
      ops::batch_norm_backward(x_, as_dtype(dy, x_.dtype()), weight_.value, save_mean_, save_invstd_, params_);
  x_ = save_mean_ = save_invstd_ = Tensor();
  g.dgamma.set_name(weight_.name + ".grad").set_role(MemoryRole::gradients);
  g.dbeta.set_name(bias_.name + ".grad").set_role(MemoryRole::gradients);
  weight_.grad = std::move(g.dgamma);
  bias_.grad = std::move(g.dbeta);
  return std::move(g.dx);
}

struct BatchNormSaved {
  Tensor x, mean, invstd;
};

std::any BatchNorm::take_saved() {
  return BatchNormSaved{std::exchange(x_, Tensor()), std::exchange(save_mean_, Tensor()),
                        std::exchange(save_invstd_, Tensor())};
}

void BatchNorm::restore_saved(std::any saved) {
  BatchNormSaved k = saved_as<BatchNormSaved>(saved, "BatchNorm");
  x_ = std::move(k.x);
  save_mean_ = std::move(k.mean);
  save_invstd_ = std::move(k.invstd);
}

std::string BatchNorm::describe() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, "BatchNorm(%lld, eps %g, momentum %g)", static_cast<long long>(channels_),
                static_cast<double>(params_.eps), static_cast<double>(params_.momentum));
  return buf;
}

// ---- Residual -------------------------------------------------------------

Residual::Residual(Engine& engine, std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride,
                   bool projection, Device device, std::uint64_t seed, std::string name, Init init)
    : in_(in_channels), out_(out_channels), stride_(stride) {
  check_positive("Residual", "in_channels", in_channels);
  check_positive("Residual", "out_channels", out_channels);
  check_positive("Residual", "stride", stride);
  if (!projection && (stride != 1 || in_channels != out_channels))
    throw InvalidArgument("Residual " + name + ": " + num(in_channels) + " -> " + num(out_channels) +
                          " channels with stride " + num(stride) +
                          " changes the shape, so the shortcut needs the 1x1 projection (projection = true)");
  conv1_ = std::make_unique<Conv2d>(engine, in_channels, out_channels, 3, Conv2dParams{stride, 1}, device,
                                    derive_seed(seed, 0), init, name + ".conv1");
  bn1_ = std::make_unique<BatchNorm>(engine, out_channels, device, name + ".bn1");
  conv2_ = std::make_unique<Conv2d>(engine, out_channels, out_channels, 3, Conv2dParams{1, 1}, device,
                                    derive_seed(seed, 1), init, name + ".conv2");
  bn2_ = std::make_unique<BatchNorm>(engine, out_channels, device, name + ".bn2");
  if (projection)
    downsample_ = std::make_unique<Conv2d>(engine, in_channels, out_channels, 1, Conv2dParams{stride, 0}, device,
                                           derive_seed(seed, 2), init, name + ".downsample");
}

Residual::~Residual() = default;

Shape Residual::output_shape(const Shape& x) const {
  const Shape y = conv1_->output_shape(x);  // names the block's convolution on a bad input
  return conv2_->output_shape(y);
}

Tensor Residual::forward(const Tensor& x) {
  check_input(x, [&] { output_shape(x.shape()); });
  Tensor y = bn2_->forward(conv2_->forward(relu1_.forward(bn1_->forward(conv1_->forward(x)))));
  const Tensor shortcut = downsample_ ? downsample_->forward(x) : x;
  return relu_out_.forward(y + shortcut);
}

Tensor Residual::backward(const Tensor& dy) {
  const Tensor d = relu_out_.backward(dy);  // throws for a backward without a training forward
  // The shortcut first: with a projection its gradients are ready earlier.
  const Tensor d_short = downsample_ ? downsample_->backward(d) : d;
  const Tensor d_main = conv1_->backward(bn1_->backward(relu1_.backward(conv2_->backward(bn2_->backward(d)))));
  return d_main + d_short;
}

Tensor Residual::backward_input(const Tensor& dy) {
  const Tensor d = relu_out_.backward(dy);
  const Tensor d_short = downsample_ ? downsample_->backward_input(d) : d;
  const Tensor d_main =
      conv1_->backward_input(bn1_->backward(relu1_.backward(conv2_->backward_input(bn2_->backward(d)))));
  return d_main + d_short;
}

void Residual::backward_weight() {
  if (downsample_) downsample_->backward_weight();
  conv2_->backward_weight();
  conv1_->backward_weight();
}

std::vector<Layer*> Residual::children() const {
  std::vector<Layer*> out{conv1_.get(), bn1_.get(), const_cast<ReLU*>(&relu1_), conv2_.get(), bn2_.get(),
                          const_cast<ReLU*>(&relu_out_)};
  if (downsample_) out.push_back(downsample_.get());
  return out;
}

std::any Residual::take_saved() {
  std::vector<std::any> saved;
  for (Layer* l : children()) saved.push_back(l->take_saved());
  return saved;
}

void Residual::restore_saved(std::any saved) {
  std::vector<std::any> parts = saved_as<std::vector<std::any>>(saved, "Residual");
  const std::vector<Layer*> layers = children();
  if (parts.empty()) parts.resize(layers.size());
  if (parts.size() != layers.size()) throw InvalidArgument("Residual::restore_saved: saved by another block");
  for (std::size_t i = 0; i < layers.size(); ++i) layers[i]->restore_saved(std::move(parts[i]));
}

void Residual::freeze_running_stats(bool frozen) {
  bn1_->freeze_running_stats(frozen);
  bn2_->freeze_running_stats(frozen);
}

std::vector<Parameter*> Residual::parameters() {
  std::vector<Parameter*> out;
  for (Layer* l : std::initializer_list<Layer*>{conv1_.get(), bn1_.get(), conv2_.get(), bn2_.get(), downsample_.get()})
    if (l) {
      const std::vector<Parameter*> p = l->parameters();
      out.insert(out.end(), p.begin(), p.end());
    }
  return out;
}

std::vector<Buffer*> Residual::buffers() {
  std::vector<Buffer*> out = bn1_->buffers();
  for (Buffer* b : bn2_->buffers()) out.push_back(b);
  return out;
}

std::string Residual::describe() const {
  std::string out = "Residual(" + num(in_) + " -> " + num(out_) + ", stride " + num(stride_);
  if (downsample_) out += ", 1x1 projection";
  return out + ")";
}

void Residual::train(bool on) {
  training_ = on;
  for (Layer* l : children()) l->train(on);
}

void Residual::set_precision(Precision p) {
  precision_ = p;
  for (Layer* l : children()) l->set_precision(p);
}

void Residual::set_memory_format(MemoryFormat f) {
  memory_format_ = f;
  for (Layer* l : children()) l->set_memory_format(f);
}

// ---- Bottleneck -----------------------------------------------------------

Bottleneck::Bottleneck(Engine& engine, std::int64_t in_channels, std::int64_t width, std::int64_t stride,
                       bool projection, Device device, std::uint64_t seed, std::string name, Init init)
    : in_(in_channels), width_(width), stride_(stride) {
  check_positive("Bottleneck", "in_channels", in_channels);
  check_positive("Bottleneck", "width", width);
  check_positive("Bottleneck", "stride", stride);
  const std::int64_t out = expansion * width;
  if (!projection && (stride != 1 || in_channels != out))
    throw InvalidArgument("Bottleneck " + name + ": " + num(in_channels) + " -> " + num(out) +
                          " channels with stride " + num(stride) +
                          " changes the shape, so the shortcut needs the 1x1 projection (projection = true)");
  conv1_ = std::make_unique<Conv2d>(engine, in_channels, width, 1, Conv2dParams{1, 0}, device, derive_seed(seed, 0),
                                    init, name + ".conv1", false);
  bn1_ = std::make_unique<BatchNorm>(engine, width, device, name + ".bn1");
  conv2_ = std::make_unique<Conv2d>(engine, width, width, 3, Conv2dParams{stride, 1}, device, derive_seed(seed, 1),
                                    init, name + ".conv2", false);
  bn2_ = std::make_unique<BatchNorm>(engine, width, device, name + ".bn2");
  conv3_ = std::make_unique<Conv2d>(engine, width, out, 1, Conv2dParams{1, 0}, device, derive_seed(seed, 2), init,
                                    name + ".conv3", false);
  bn3_ = std::make_unique<BatchNorm>(engine, out, device, name + ".bn3");
  if (projection) {
    downsample_ = std::make_unique<Conv2d>(engine, in_channels, out, 1, Conv2dParams{stride, 0}, device,
                                           derive_seed(seed, 3), init, name + ".downsample.0", false);
    downsample_bn_ = std::make_unique<BatchNorm>(engine, out, device, name + ".downsample.1");
  }
}

Bottleneck::~Bottleneck() = default;

Shape Bottleneck::output_shape(const Shape& x) const {
  const Shape y = conv1_->output_shape(x);  // names the block's convolution on a bad input
  return conv3_->output_shape(conv2_->output_shape(y));
}

Tensor Bottleneck::forward(const Tensor& x) {
  check_input(x, [&] { output_shape(x.shape()); });
  const Tensor h = relu1_.forward(bn1_->forward(conv1_->forward(x)));
  Tensor y = bn3_->forward(conv3_->forward(relu2_.forward(bn2_->forward(conv2_->forward(h)))));
  const Tensor shortcut = downsample_ ? downsample_bn_->forward(downsample_->forward(x)) : x;
  return relu_out_.forward(y + shortcut);
}

Tensor Bottleneck::backward(const Tensor& dy) {
  const Tensor d = relu_out_.backward(dy);  // throws for a backward without a training forward
  // The shortcut first: with a projection its gradients are ready earlier.
  const Tensor d_short = downsample_ ? downsample_->backward(downsample_bn_->backward(d)) : d;
  const Tensor d_h =
      relu1_.backward(conv2_->backward(bn2_->backward(relu2_.backward(conv3_->backward(bn3_->backward(d))))));
  return conv1_->backward(bn1_->backward(d_h)) + d_short;
}

Tensor Bottleneck::backward_input(const Tensor& dy) {
  const Tensor d = relu_out_.backward(dy);
  const Tensor d_short = downsample_ ? downsample_->backward_input(downsample_bn_->backward(d)) : d;
  const Tensor d_h = relu1_.backward(
      conv2_->backward_input(bn2_->backward(relu2_.backward(conv3_->backward_input(bn3_->backward(d))))));
  return conv1_->backward_input(bn1_->backward(d_h)) + d_short;
}

void Bottleneck::backward_weight() {
  if (downsample_) downsample_->backward_weight();
  conv3_->backward_weight();
  conv2_->backward_weight();
  conv1_->backward_weight();
}

std::vector<Layer*> Bottleneck::children() const {
  std::vector<Layer*> out{conv1_.get(), bn1_.get(), const_cast<ReLU*>(&relu1_),   conv2_.get(),
                          bn2_.get(),   const_cast<ReLU*>(&relu2_), conv3_.get(), bn3_.get(),
                          const_cast<ReLU*>(&relu_out_)};
  if (downsample_) {
    out.push_back(downsample_.get());
    out.push_back(downsample_bn_.get());
  }
  return out;
}

std::any Bottleneck::take_saved() {
  std::vector<std::any> saved;
  for (Layer* l : children()) saved.push_back(l->take_saved());
  return saved;
}

void Bottleneck::restore_saved(std::any saved) {
  std::vector<std::any> parts = saved_as<std::vector<std::any>>(saved, "Bottleneck");
  const std::vector<Layer*> layers = children();
  if (parts.empty()) parts.resize(layers.size());
  if (parts.size() != layers.size()) throw InvalidArgument("Bottleneck::restore_saved: saved by another block");
  for (std::size_t i = 0; i < layers.size(); ++i) layers[i]->restore_saved(std::move(parts[i]));
}

void Bottleneck::freeze_running_stats(bool frozen) {
  for (Layer* l : children()) l->freeze_running_stats(frozen);
}

std::vector<Parameter*> Bottleneck::parameters() {
  std::vector<Parameter*> out;
  for (Layer* l : std::initializer_list<Layer*>{conv1_.get(), bn1_.get(), conv2_.get(), bn2_.get(), conv3_.get(),
                                                bn3_.get(), downsample_.get(), downsample_bn_.get()})
    if (l) {
      const std::vector<Parameter*> p = l->parameters();
      out.insert(out.end(), p.begin(), p.end());
    }
  return out;
}

std::vector<Buffer*> Bottleneck::buffers() {
  std::vector<Buffer*> out;
  for (BatchNorm* bn : {bn1_.get(), bn2_.get(), bn3_.get(), downsample_bn_.get()})
    if (bn)
      for (Buffer* b : bn->buffers()) out.push_back(b);
  return out;
}

std::string Bottleneck::describe() const {
  std::string out = "Bottleneck(" + num(in_) + " -> " + num(width_) + " -> " + num(expansion * width_) + ", stride " +
                    num(stride_);
  if (downsample_) out += ", 1x1 projection";
  return out + ")";
}

void Bottleneck::train(bool on) {
  training_ = on;
  for (Layer* l : children()) l->train(on);
}

void Bottleneck::set_precision(Precision p) {
  precision_ = p;
  for (Layer* l : children()) l->set_precision(p);
}

void Bottleneck::set_memory_format(MemoryFormat f) {
  memory_format_ = f;
  for (Layer* l : children()) l->set_memory_format(f);
}

// ---- Flatten ------------------------------------------------------------

Shape Flatten::output_shape(const Shape& x) const {
  if (x.rank() < 1) throw InvalidArgument("Flatten: input must have a batch axis, got a scalar");
  std::int64_t rest = 1;
  for (std::size_t i = 1; i < x.rank(); ++i) rest *= x[i];
  return Shape{x[0], rest};
}

Tensor Flatten::forward(const Tensor& x) {
  const Shape& s = x.shape();
  // A channels_last input whose NHWC order is not NCHW's is reordered first.
  const bool reorder = x.defined() && x.memory_format() == MemoryFormat::channels_last && s[1] != 1 && s[2] * s[3] != 1;
  Tensor y = (reorder ? ops::contiguous(x) : x).reshape(output_shape(x.shape()));
  x_shape_ = x.shape();
  x_format_ = x.defined() ? x.memory_format() : MemoryFormat::contiguous;
  have_x_ = training_;
  return y;
}

std::any Flatten::take_saved() { return KeptShape{x_shape_, std::exchange(have_x_, false)}; }

void Flatten::restore_saved(std::any saved) {
  const KeptShape k = saved_as<KeptShape>(saved, "Flatten");
  x_shape_ = k.shape;
  have_x_ = k.have;
}

Tensor Flatten::backward(const Tensor& dy) {
  if (!have_x_) no_forward("Flatten");
  check_dy("Flatten", dy, output_shape(x_shape_));
  have_x_ = false;
  if (x_format_ == MemoryFormat::channels_last)
    return ops::to_memory_format(ops::contiguous(dy).reshape(x_shape_), MemoryFormat::channels_last);
  return dy.reshape(x_shape_);
}

}  // namespace weft::nn
