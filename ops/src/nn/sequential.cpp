// Sequential and Recompute, SGD and the ready-made models (LeNet, MLP, ResNet-18, ResNet-50).
#include <algorithm>
#include <any>
#include <sstream>
#include <string>
#include <utility>

#include "weft/error.h"
#include "weft/nn.h"

namespace weft::nn {

namespace {

// "[N, 20, 26, 26]": the batch extent as N.
std::string batch_shape(const Shape& s) {
  if (s.rank() == 0) return "[]";
  std::string out = "[N";
  for (std::size_t i = 1; i < s.rank(); ++i) out += ", " + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

Sequential& Sequential::add(std::unique_ptr<Layer> layer) {
  if (!layer) throw InvalidArgument("Sequential::add: null layer");
  layer->train(training_);
  layer->set_precision(precision_);
  layer->set_memory_format(memory_format_);
  layers_.push_back(std::move(layer));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  if (!x.defined()) throw InvalidArgument("Sequential::forward: undefined input");
  input_shape_ = x.shape();
  have_input_shape_ = true;
  Tensor y = x;
  for (auto& layer : layers_) y = layer->forward(y);
  return y;
}

Tensor Sequential::backward(const Tensor& dy) {
  Tensor d = dy;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) d = (*it)->backward(d);
  return d;
}

Tensor Sequential::backward_input(const Tensor& dy) {
  Tensor d = dy;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) d = (*it)->backward_input(d);
  return d;
}

void Sequential::backward_weight() {
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) (*it)->backward_weight();
}

std::any Sequential::take_saved() {
  std::vector<std::any> saved;
  for (auto& layer : layers_) saved.push_back(layer->take_saved());
  return saved;
}

void Sequential::restore_saved(std::any saved) {
  if (!saved.has_value()) saved = std::vector<std::any>(layers_.size());
  auto* parts = std::any_cast<std::vector<std::any>>(&saved);
  if (!parts || parts->size() != layers_.size())
    throw InvalidArgument("Sequential::restore_saved: not what this Sequential's take_saved gave");
  for (std::size_t i = 0; i < layers_.size(); ++i) layers_[i]->restore_saved(std::move((*parts)[i]));
}

void Sequential::freeze_running_stats(bool frozen) {
  for (auto& layer : layers_) layer->freeze_running_stats(frozen);
}

void Sequential::recompute(int segments) {
  const auto n = static_cast<int>(layers_.size());
  if (segments < 1 || segments > n)
    throw InvalidArgument("Sequential::recompute: " + std::to_string(segments) + " segments for " + std::to_string(n) +
                          " layers (want 1 to " + std::to_string(n) + ")");
  std::vector<std::unique_ptr<Layer>> layers = std::move(layers_);
  layers_.clear();
  std::size_t next = 0;
  for (int k = 0; k < segments; ++k) {
    const auto count = static_cast<std::size_t>(n / segments + (k < n % segments ? 1 : 0));
    if (k + 1 == segments) {  // the last run stays as it is
      for (; next < layers.size(); ++next) layers_.push_back(std::move(layers[next]));
      break;
    }
    auto segment = std::make_unique<Sequential>();
    segment->train(training_);
    segment->set_precision(precision_);
    segment->set_memory_format(memory_format_);
    for (std::size_t i = 0; i < count; ++i) segment->add(std::move(layers[next++]));
    layers_.push_back(std::make_unique<Recompute>(std::move(segment)));
  }
}

// ---- Recompute -------------------------------------------------------------

Recompute::Recompute(std::unique_ptr<Sequential> segment) : segment_(std::move(segment)) {
  if (!segment_) throw InvalidArgument("Recompute: null segment");
  training_ = segment_->training();
  precision_ = segment_->precision();
}

Tensor Recompute::forward(const Tensor& x) {
  if (!x.defined()) throw InvalidArgument("Recompute::forward: undefined input");
  Tensor y = segment_->forward(x);
  if (training_) {
    // Keep the input only: what the layers kept goes (its memory is freed
    // once the forward's ops are done with it).
    (void)segment_->take_saved();
    x_ = x;
    recomputed_ = false;
  }
  return y;
}

void Recompute::recompute_forward(const Tensor& dy) {
  if (!x_.defined())
    throw InvalidArgument("Recompute(" + std::to_string(segment_->size()) +
                          " layers): backward without a training forward before it");
  if (!dy.defined()) throw InvalidArgument("Recompute::backward: undefined output gradient");
  // Its input was ready since the forward: by itself the recomputation would
  // run (and take its memory) at once, every segment's together. It waits
  // for the gradient that reaches this segment.
  ops::WaitFor gate(dy.var());
  // The same input and batch statistics give the same activations; the
  // running statistics saw this batch already.
  segment_->freeze_running_stats(true);
  try {
    (void)segment_->forward(x_);
  } catch (...) {
    segment_->freeze_running_stats(false);
    throw;
  }
  segment_->freeze_running_stats(false);
  x_ = Tensor();
}

Tensor Recompute::backward(const Tensor& dy) {
  recompute_forward(dy);
  return segment_->backward(dy);
}

Tensor Recompute::backward_input(const Tensor& dy) {
  recompute_forward(dy);
  recomputed_ = true;
  return segment_->backward_input(dy);
}

void Recompute::backward_weight() {
  if (!recomputed_) throw InvalidArgument("Recompute: backward_weight without a backward_input before it");
  recomputed_ = false;
  segment_->backward_weight();
}

std::vector<Parameter*> Recompute::parameters() { return segment_->parameters(); }
std::vector<Buffer*> Recompute::buffers() { return segment_->buffers(); }
std::vector<Parameter*> Recompute::tied_parameters() { return segment_->tied_parameters(); }
Shape Recompute::output_shape(const Shape& input) const { return segment_->output_shape(input); }

std::string Recompute::describe() const {
  std::string out = "Recompute(";
  for (std::size_t i = 0; i < segment_->size(); ++i) out += (i ? ", " : "") + (*segment_)[i].describe();
  return out + ")";
}

void Recompute::train(bool on) {
  training_ = on;
  segment_->train(on);
  if (!on) x_ = Tensor();
}

void Recompute::set_precision(Precision p) {
  precision_ = p;
  segment_->set_precision(p);
}

void Recompute::set_memory_format(MemoryFormat f) {
  memory_format_ = f;
  segment_->set_memory_format(f);
}

namespace {
struct RecomputeSaved {
  Tensor x;
  std::any segment;  // between backward_input and backward_weight
  bool recomputed = false;
};
}  // namespace

std::any Recompute::take_saved() {
  RecomputeSaved saved{std::exchange(x_, Tensor()), recomputed_ ? segment_->take_saved() : std::any(), recomputed_};
  recomputed_ = false;
  return saved;
}

void Recompute::restore_saved(std::any saved) {
  if (!saved.has_value()) {
    x_ = Tensor();
    recomputed_ = false;
    return;
  }
  auto* s = std::any_cast<RecomputeSaved>(&saved);
  if (!s) throw InvalidArgument("Recompute::restore_saved: not what a Recompute's take_saved gave");
  x_ = std::move(s->x);
  recomputed_ = s->recomputed;
  if (recomputed_) segment_->restore_saved(std::move(s->segment));
}

void Recompute::freeze_running_stats(bool frozen) { segment_->freeze_running_stats(frozen); }

std::vector<Parameter*> Sequential::parameters() {
  std::vector<Parameter*> out;
  for (auto& layer : layers_) {
    std::vector<Parameter*> p = layer->parameters();
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

// The children's ties to parameters outside this container (a tie between
// two of its children is its own business).
std::vector<Parameter*> Sequential::tied_parameters() {
  const std::vector<Parameter*> own = parameters();
  std::vector<Parameter*> out;
  for (auto& layer : layers_)
    for (Parameter* p : layer->tied_parameters())
      if (std::find(own.begin(), own.end(), p) == own.end() && std::find(out.begin(), out.end(), p) == out.end())
        out.push_back(p);
  return out;
}

std::vector<Buffer*> Sequential::buffers() {
  std::vector<Buffer*> out;
  for (auto& layer : layers_) {
    std::vector<Buffer*> b = layer->buffers();
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

Shape Sequential::output_shape(const Shape& input) const {
  Shape s = input;
  for (const auto& layer : layers_) s = layer->output_shape(s);
  return s;
}

std::string Sequential::describe() const {
  std::ostringstream os;
  os << "Sequential (" << layers_.size() << " layers)";
  bool shapes = have_input_shape_;
  Shape s = input_shape_;
  if (shapes) os << ", input " << batch_shape(s);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& layer = *layers_[i];
    os << "\n  " << (i + 1) << ". " << layer.describe();
    if (shapes) {
      try {
        s = layer.output_shape(s);
        os << " -> " << batch_shape(s);
      } catch (const Error&) {
        shapes = false;  // the assumed input does not fit: no shapes from here on
      }
    }
    const std::int64_t n = parameter_count(layer.parameters());
    total += n;
    if (n) os << "  (" << n << " parameters)";
  }
  os << "\n  total: " << total << " parameters";
  return os.str();
}

void Sequential::train(bool on) {
  training_ = on;
  for (auto& layer : layers_) layer->train(on);
}

void Sequential::set_precision(Precision p) {
  precision_ = p;
  for (auto& layer : layers_) layer->set_precision(p);
}

void Sequential::set_memory_format(MemoryFormat f) {
  if (f == MemoryFormat::channels_last && have_input_shape_ && input_shape_.rank() != 4)
    throw InvalidArgument("Sequential::set_memory_format: the model takes " + batch_shape(input_shape_) +
                          " inputs (rank " + std::to_string(input_shape_.rank()) +
                          "); channels_last needs 4-D [N, C, H, W] inputs");
  memory_format_ = f;
  for (auto& layer : layers_) layer->set_memory_format(f);
}

std::int64_t parameter_count(const std::vector<Parameter*>& params) {
  std::int64_t n = 0;
  for (const Parameter* p : params) n += p->value.numel();
  return n;
}

void sgd_step(const std::vector<Parameter*>& params, float lr, float weight_decay) {
  sgd_step(params, lr, weight_decay, Tensor());
}

void sgd_step(const std::vector<Parameter*>& params, float lr, float weight_decay, const Tensor& skip) {
  for (Parameter* p : params) {
    if (!p->grad.defined())
      throw InvalidArgument("sgd_step: parameter '" + p->name + "' has no gradient (run backward first)");
    ops::sgd_update(p->value, p->grad, lr, weight_decay, skip);
  }
}

std::unique_ptr<Sequential> lenet(Engine& engine, Device device, std::uint64_t seed) {
  // Kaiming for the layers a ReLU follows (keeps the activation scale through
  // the ReLUs), Xavier for the classifier (small initial logits). See Init.
  auto net = std::make_unique<Sequential>();
  std::uint64_t i = 0;
  net->emplace<Conv2d>(engine, 1, 20, 3, Conv2dParams{}, device, derive_seed(seed, i++), Init::kaiming_uniform,
                       "conv1");
  net->emplace<ReLU>();
  net->emplace<AvgPool2d>(Pool2dParams{2, 2});
  net->emplace<Conv2d>(engine, 20, 50, 5, Conv2dParams{}, device, derive_seed(seed, i++), Init::kaiming_uniform,
                       "conv2");
  net->emplace<ReLU>();
  net->emplace<AvgPool2d>(Pool2dParams{2, 2});
  net->emplace<Flatten>();
  net->emplace<Dense>(engine, 50 * 4 * 4, 128, device, derive_seed(seed, i++), Init::kaiming_uniform, "fc1");
  net->emplace<ReLU>();
  net->emplace<Dense>(engine, 128, 10, device, derive_seed(seed, i++), Init::xavier_uniform, "fc2");
  net->set_input_shape(Shape{1, 1, 28, 28});
  return net;
}

std::unique_ptr<Sequential> mlp(Engine& engine, std::vector<std::int64_t> sizes, Device device, std::uint64_t seed) {
  if (sizes.size() < 2) throw InvalidArgument("mlp: need at least two sizes (input and output), got " + std::to_string(sizes.size()));
  auto net = std::make_unique<Sequential>();
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    const bool last = i + 2 == sizes.size();
    net->emplace<Dense>(engine, sizes[i], sizes[i + 1], device, derive_seed(seed, i),
                        last ? Init::xavier_uniform : Init::kaiming_uniform, "fc" + std::to_string(i + 1));
    if (!last) net->emplace<ReLU>();
  }
  net->set_input_shape(Shape{1, sizes.front()});
  return net;
}

std::unique_ptr<Sequential> resnet18(Engine& engine, Device device, std::uint64_t seed, ResNetOptions options) {
  if (options.in_channels < 1 || options.classes < 1)
    throw InvalidArgument("resnet18: in_channels and classes must be positive, got " +
                          std::to_string(options.in_channels) + " and " + std::to_string(options.classes));
  constexpr Init init = Init::fan_in_uniform;
  auto net = std::make_unique<Sequential>();
  std::uint64_t i = 0;
  if (options.stem == ResNetStem::small) {
    net->emplace<Conv2d>(engine, options.in_channels, 64, 3, Conv2dParams{1, 1}, device, derive_seed(seed, i++),
                         init, "conv1");
  } else {
    net->emplace<Conv2d>(engine, options.in_channels, 64, 7, Conv2dParams{2, 3}, device, derive_seed(seed, i++),
                         init, "conv1");
  }
  net->emplace<BatchNorm>(engine, 64, device, "bn1");
  net->emplace<ReLU>();
  if (options.stem == ResNetStem::imagenet) net->emplace<MaxPool2d>(Pool2dParams{3, 2, 1});
  // Four stages of two blocks; every stage but the first halves the
  // resolution and doubles the channels in its first block.
  std::int64_t channels = 64;
  for (int stage = 1; stage <= 4; ++stage) {
    const std::int64_t out = stage == 1 ? 64 : channels * 2;
    for (int block = 0; block < 2; ++block) {
      const bool first = block == 0 && stage > 1;
      net->emplace<Residual>(engine, block == 0 ? channels : out, out, first ? 2 : 1, first, device,
                             derive_seed(seed, i++),
                             "layer" + std::to_string(stage) + "." + std::to_string(block), init);
    }
    channels = out;
  }
  net->emplace<GlobalAvgPool2d>();
  net->emplace<Flatten>();
  net->emplace<Dense>(engine, 512, options.classes, device, derive_seed(seed, i++), init, "fc");
  net->set_input_shape(options.stem == ResNetStem::small ? Shape{1, options.in_channels, 28, 28}
                                                         : Shape{1, options.in_channels, 96, 96});
  return net;
}

std::unique_ptr<Sequential> resnet50(Engine& engine, Device device, std::uint64_t seed, ResNetOptions options) {
  if (options.in_channels < 1 || options.classes < 1)
    throw InvalidArgument("resnet50: in_channels and classes must be positive, got " +
                          std::to_string(options.in_channels) + " and " + std::to_string(options.classes));
  constexpr Init init = Init::fan_in_uniform;
  auto net = std::make_unique<Sequential>();
  std::uint64_t i = 0;
  if (options.stem == ResNetStem::small) {
    net->emplace<Conv2d>(engine, options.in_channels, 64, 3, Conv2dParams{1, 1}, device, derive_seed(seed, i++),
                         init, "conv1", false);
  } else {
    net->emplace<Conv2d>(engine, options.in_channels, 64, 7, Conv2dParams{2, 3}, device, derive_seed(seed, i++),
                         init, "conv1", false);
  }
  net->emplace<BatchNorm>(engine, 64, device, "bn1");
  net->emplace<ReLU>();
  if (options.stem == ResNetStem::imagenet) net->emplace<MaxPool2d>(Pool2dParams{3, 2, 1});
  // Four stages of 3, 4, 6 and 3 blocks; each stage's first block projects
  // the shortcut to its 4 * width channels and, but in the first stage,
  // halves the resolution.
  constexpr int blocks[4] = {3, 4, 6, 3};
  std::int64_t channels = 64;
  for (int stage = 1; stage <= 4; ++stage) {
    const std::int64_t width = std::int64_t{64} << (stage - 1);
    for (int block = 0; block < blocks[stage - 1]; ++block) {
      net->emplace<Bottleneck>(engine, channels, width, block == 0 && stage > 1 ? 2 : 1, block == 0, device,
                               derive_seed(seed, i++),
                               "layer" + std::to_string(stage) + "." + std::to_string(block), init);
      channels = Bottleneck::expansion * width;
    }
  }
  net->emplace<GlobalAvgPool2d>();
  net->emplace<Flatten>();
  net->emplace<Dense>(engine, channels, options.classes, device, derive_seed(seed, i++), init, "fc");
  net->set_input_shape(options.stem == ResNetStem::small ? Shape{1, options.in_channels, 28, 28}
                                                         : Shape{1, options.in_channels, 224, 224});
  return net;
}

}  // namespace weft::nn
