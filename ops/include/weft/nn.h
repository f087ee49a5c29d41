// weft::nn — layers for training small networks layer by layer (no autograd
// tape): forward() keeps what backward() needs; backward() sets the gradients
// of the layer's parameters and returns the gradient of its input. Everything
// pushes engine ops (weft/ops.h, weft/nn_ops.h) and returns at once. In
// training mode (the default) a layer keeps its forward's tensors until
// backward() (which drops them) or the next forward(); in evaluation mode
// (train(false)) it keeps nothing. Parameters are named ("fc1.weight", their
// gradients "fc1.weight.grad") and initialized with Tensor::uniform from
// per-layer seeds, so a model built with the same seed has the same weights on
// every device and engine; biases start at zero.
#pragma once

#include <any>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "weft/nn_ops.h"
#include "weft/ops.h"
#include "weft/precision.h"
#include "weft/tensor.h"

namespace weft::nn {

using ops::BatchNormParams;
using ops::Conv2dParams;
using ops::Pool2dParams;

// A trainable tensor and its latest gradient (undefined until the first
// backward; each backward replaces it with a new tensor).
struct Parameter {
  std::string name;
  Tensor value, grad;
};

// State a layer keeps that is not trained: batch normalization's running
// statistics. It has no gradient, is left out of gradient reduction, and is
// per replica under data parallelism.
struct Buffer {
  std::string name;
  Tensor value;
};

// Weight initialization, both uniform and symmetric around zero:
//   kaiming_uniform: U(-a, a), a = sqrt(6 / fan_in) (He et al. 2015). Keeps the
//     activations' second moment constant through layers followed by a ReLU
//     (the ReLU zeroes half of each input's distribution, the factor 2 in
//     Var(w) = 2 / fan_in makes up for it).
//   xavier_uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)) (Glorot and
//     Bengio 2010). For a layer with no ReLU after it (the classifier), where
//     it keeps the initial logits small, so the first loss is near ln(classes).
//   fan_in_uniform: U(-a, a), a = 1 / sqrt(fan_in): PyTorch's default for
//     Linear and Conv2d (kaiming_uniform with a = sqrt(5)), a third of
//     kaiming's variance over two. What D2L's ResNet trains with at lr 0.1;
//     with kaiming's larger weights on its unnormalized shortcuts and
//     classifier, ResNet-18 starts with a loss near 6 and diverges there.
// fan_in = in (dense) or in_channels * kernel^2 (conv); fan_out likewise.
enum class Init : std::uint8_t { kaiming_uniform, xavier_uniform, fan_in_uniform };

// A seed for the index-th layer of a model built from `seed` (SplitMix64 of
// both), so neighbouring seeds and layers get unrelated streams.
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t index) noexcept;

class Layer {
 public:
  Layer() = default;
  virtual ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // Pushes the forward ops; in training mode remembers what backward needs.
  virtual Tensor forward(const Tensor& x) = 0;
  // Pushes the backward ops for the last forward: sets the grads of the
  // parameters and returns dx (same shape as that forward's input). Drops
  // what forward remembered. Throws weft::Error when there was no training
  // forward since the last backward, or dy's shape is not the output's.
  virtual Tensor backward(const Tensor& dy) = 0;
  // The layer's parameters (pointers stay valid as long as the layer).
  virtual std::vector<Parameter*> parameters();
  // Its buffers (running statistics), likewise.
  virtual std::vector<Buffer*> buffers();
  // Weight tying: parameters another layer owns (lists in its parameters())
  // that this one computes with too (LMHead and its Embedding). A
  // data-parallel trainer gathers them for this layer as well (ZeRO stage
  // 3); a pipeline refuses ties across processes. Default: none.
  virtual std::vector<Parameter*> tied_parameters();
  // The output shape for an input shape, without pushing anything; throws
  // weft::Error when the input does not fit the layer.
  virtual Shape output_shape(const Shape& input) const = 0;
  // One line, e.g. "Conv2d(1 -> 20, kernel 3, stride 1, pad 0)".
  virtual std::string describe() const = 0;

  // Training mode (default true): forward() keeps what backward() needs.
  // Evaluation mode: forward() keeps nothing and backward() throws.
  virtual void train(bool on) { training_ = on; }
  bool training() const noexcept { return training_; }

  // Backward in two halves, for schedules that run them apart (zero-bubble
  // pipelines move the weight half into idle time): backward_input(dy)
  // pushes what dx needs and returns dx; backward_weight() then pushes the
  // parameters' gradients (same values as backward()). backward(dy) is the
  // two in a row. Defaults: backward_input runs the whole backward, and
  // backward_weight does nothing (a layer whose gradients come from one op,
  // as batch norm's). backward_weight throws weft::Error when no
  // backward_input is waiting for it.
  virtual Tensor backward_input(const Tensor& dy) { return backward(dy); }
  virtual void backward_weight() {}

  // What training forwards kept for backward — and a backward_input kept
  // for its backward_weight — taken out of the layer, which then keeps
  // nothing, and put back later: several micro-batches between forward and
  // backward at once (pipelines). Opaque; restore_saved takes only what
  // take_saved of the same layer gave. Defaults: nothing kept.
  virtual std::any take_saved() { return {}; }
  virtual void restore_saved(std::any saved) { (void)saved; }

  // While frozen, training forwards leave running statistics alone (batch
  // norm): a forward that repeats an earlier one (recomputation) must not
  // count its batch twice. Default: nothing to freeze.
  virtual void freeze_running_stats(bool frozen) { (void)frozen; }

  // How the layer computes (weft/precision.h; default fp32). Parameters stay
  // float32 whatever it is: under bf16 / fp16, Dense and Conv2d cast their
  // input and parameters to the half type, compute there, save the half
  // copies for backward and hand back float32 gradients; their output (and
  // the dx they return) is half, and the layers after them (batch norm,
  // ReLU, pooling) keep the dtype they are given. Under tf32 their float32
  // GEMMs and convolutions run as TF32. Containers set it on every child.
  virtual void set_precision(Precision p) { precision_ = p; }
  Precision precision() const noexcept { return precision_; }

  // The memory format of the layer's 4-D activations (weft/tensor.h;
  // default contiguous). Under channels_last, Conv2d, BatchNorm and the
  // pooling layers convert a contiguous 4-D input first (one
  // to_channels_last op: a model converts its input once, and the ops keep
  // the format from there), Flatten converts back before its reshape, and
  // layers on 2-D inputs (Dense, ReLU on [N, F]) are unaffected. Parameters
  // stay contiguous (OIHW filters, which the convolutions convert for
  // themselves). Containers set it on every child; a Sequential whose input
  // shape is known and not 4-D refuses channels_last (weft::InvalidArgument
  // naming the model, its input shape and the format).
  virtual void set_memory_format(MemoryFormat f) { memory_format_ = f; }
  MemoryFormat memory_format() const noexcept { return memory_format_; }

 protected:
  bool training_ = true;
  Precision precision_ = Precision::fp32;
  MemoryFormat memory_format_ = MemoryFormat::contiguous;
};

// y = x w^T + b; x [N, in], w [out, in], b [out].
class Dense : public Layer {
 public:
  Dense(Engine& engine, std::int64_t in, std::int64_t out, Device device = {}, std::uint64_t seed = 0,
        Init init = Init::kaiming_uniform, std::string name = "dense");
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;

  Tensor backward_input(const Tensor& dy) override;
  void backward_weight() override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

  Parameter& weight() noexcept { return weight_; }
  Parameter& bias() noexcept { return bias_; }

 private:
  std::int64_t in_, out_;
  Parameter weight_, bias_;
  Tensor x_;   // forward's input (in the compute dtype), until backward (or backward_weight)
  Tensor w_;   // the weight forward computed with (a half copy under bf16 / fp16)
  Tensor dy_;  // backward_input's dy, until backward_weight
};

// 2-D convolution, NCHW input, OIHW square filter [out, in, kernel, kernel], bias [out].
// With bias = false it has no bias (the batch norm after it would cancel one):
// parameters() is the weight alone and bias() an empty Parameter.
class Conv2d : public Layer {
 public:
  Conv2d(Engine& engine, std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel,
         Conv2dParams params = {}, Device device = {}, std::uint64_t seed = 0, Init init = Init::kaiming_uniform,
         std::string name = "conv", bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;

  Tensor backward_input(const Tensor& dy) override;
  void backward_weight() override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

  Parameter& weight() noexcept { return weight_; }
  Parameter& bias() noexcept { return bias_; }

 private:
  std::int64_t in_, out_, kernel_;
  Conv2dParams params_;
  bool has_bias_;
  Parameter weight_, bias_;  // bias_ empty without a bias
  Tensor x_, w_, dy_;  // as Dense's
};

class ReLU : public Layer {
 public:
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Shape output_shape(const Shape& input) const override { return input; }
  std::string describe() const override { return "ReLU"; }
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  Tensor x_;
};

// Batch normalization over the channel axis of [N, C, H, W] (or [N, C])
// inputs (ops::batch_norm_train / _infer / _backward). Parameters
// "<name>.weight" (gamma, starts at 1) and "<name>.bias" (beta, 0); buffers
// "<name>.running_mean" (0) and "<name>.running_var" (1). Training mode
// normalizes by the batch's statistics and updates the running ones (so
// each forward in training mode counts, even without a backward);
// evaluation mode normalizes by the running statistics.
class BatchNorm : public Layer {
 public:
  BatchNorm(Engine& engine, std::int64_t channels, Device device = {}, std::string name = "bn",
            BatchNormParams params = {});
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  std::vector<Buffer*> buffers() override { return {&running_mean_, &running_var_}; }
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;

  Parameter& weight() noexcept { return weight_; }
  Parameter& bias() noexcept { return bias_; }
  Buffer& running_mean() noexcept { return running_mean_; }
  Buffer& running_var() noexcept { return running_var_; }
  std::any take_saved() override;
  void restore_saved(std::any saved) override;
  void freeze_running_stats(bool frozen) override { frozen_ = frozen; }

 private:
  std::int64_t channels_;
  BatchNormParams params_;
  bool frozen_ = false;
  std::string name_;
  Parameter weight_, bias_;
  Buffer running_mean_, running_var_;
  Tensor x_, save_mean_, save_invstd_;  // from a training forward, until backward
};

class AvgPool2d : public Layer {
 public:
  explicit AvgPool2d(Pool2dParams params = {}) : params_(params) {}
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  Pool2dParams params_;
  Shape x_shape_;  // only the shape: avg pooling's backward needs no data
  bool have_x_ = false;
};

class MaxPool2d : public Layer {
 public:
  explicit MaxPool2d(Pool2dParams params = {}) : params_(params) {}
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  Pool2dParams params_;
  Tensor x_;
};

// [N, C, H, W] -> [N, C, 1, 1]: the mean of each plane (PyTorch's
// AdaptiveAvgPool2d((1, 1))).
class GlobalAvgPool2d : public Layer {
 public:
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override { return "GlobalAvgPool2d"; }
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  Shape x_shape_;
  MemoryFormat x_format_ = MemoryFormat::contiguous;
  bool have_x_ = false;
};

// [N, d1, d2, ...] -> [N, d1 * d2 * ...] (a reshape: shares the storage; a
// channels_last input is converted to contiguous first, and dx back).
class Flatten : public Layer {
 public:
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override { return "Flatten"; }
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  Shape x_shape_;
  MemoryFormat x_format_ = MemoryFormat::contiguous;
  bool have_x_ = false;
};

// The residual block of ResNet-18/34 (He et al. 2016; D2L's `Residual`):
//   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
// conv1 and conv2 are 3x3 with padding 1, conv1 with `stride`; the shortcut
// is x itself, or with `projection` a 1x1 convolution with `stride` (needed
// when the stride or the channel count changes). Parameters are named
// "<name>.conv1.weight", "<name>.bn1.weight", ..., "<name>.downsample.weight";
// the buffers "<name>.bn1.running_mean", ... Its backward adds the two
// paths' input gradients.
class Residual : public Layer {
 public:
  Residual(Engine& engine, std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride = 1,
           bool projection = false, Device device = {}, std::uint64_t seed = 0, std::string name = "block",
           Init init = Init::kaiming_uniform);
  ~Residual() override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override;
  std::vector<Buffer*> buffers() override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  void train(bool on) override;
  void set_precision(Precision p) override;
  void set_memory_format(MemoryFormat f) override;
  Tensor backward_input(const Tensor& dy) override;
  void backward_weight() override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;
  void freeze_running_stats(bool frozen) override;

 private:
  std::vector<Layer*> children() const;  // in forward order, the shortcut's last
  std::int64_t in_, out_, stride_;
  std::unique_ptr<Conv2d> conv1_, conv2_, downsample_;  // downsample_: null without projection
  std::unique_ptr<BatchNorm> bn1_, bn2_;
  ReLU relu1_, relu_out_;
};

// The bottleneck block of ResNet-50/101/152 (He et al. 2016) in torchvision's
// layout (v1.5: the stride on the 3x3):
//   y = relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x))
// conv1 1x1 in_channels -> width, conv2 3x3 width -> width with `stride` and
// padding 1, conv3 1x1 width -> 4 * width (expansion); the shortcut is x
// itself, or with `projection` a 1x1 convolution with `stride` and a batch
// norm (needed when the stride or the channel count changes). The
// convolutions have no bias (each has a batch norm after it). Parameters are
// named as torchvision's: "<name>.conv1.weight", "<name>.bn1.weight", ...,
// "<name>.downsample.0.weight" (the projection), "<name>.downsample.1.bias"
// (its batch norm); the buffers "<name>.bn1.running_mean", ... Its backward
// adds the two paths' input gradients.
class Bottleneck : public Layer {
 public:
  static constexpr std::int64_t expansion = 4;
  Bottleneck(Engine& engine, std::int64_t in_channels, std::int64_t width, std::int64_t stride = 1,
             bool projection = false, Device device = {}, std::uint64_t seed = 0, std::string name = "block",
             Init init = Init::kaiming_uniform);
  ~Bottleneck() override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override;
  std::vector<Buffer*> buffers() override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;  // "Bottleneck(256 -> 128 -> 512, stride 2, 1x1 projection)"
  void train(bool on) override;
  void set_precision(Precision p) override;
  void set_memory_format(MemoryFormat f) override;
  Tensor backward_input(const Tensor& dy) override;
  void backward_weight() override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;
  void freeze_running_stats(bool frozen) override;

 private:
  std::vector<Layer*> children() const;  // in forward order, the shortcut's last
  std::int64_t in_, width_, stride_;
  std::unique_ptr<Conv2d> conv1_, conv2_, conv3_, downsample_;  // downsample_: null without projection
  std::unique_ptr<BatchNorm> bn1_, bn2_, bn3_, downsample_bn_;  // likewise downsample_bn_
  ReLU relu1_, relu2_, relu_out_;
};

// Layers in order; backward runs them in reverse.
class Sequential : public Layer {
 public:
  Sequential() = default;
  Sequential& add(std::unique_ptr<Layer> layer);  // throws weft::Error for null
  template <class L, class... Args>
  L& emplace(Args&&... args) {
    auto layer = std::make_unique<L>(std::forward<Args>(args)...);
    L& ref = *layer;
    add(std::move(layer));
    return ref;
  }

  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override;
  std::vector<Buffer*> buffers() override;
  std::vector<Parameter*> tied_parameters() override;
  Shape output_shape(const Shape& input) const override;
  // One line per layer, numbered, with its output shape when known (from the
  // last forward's input, or set_input_shape's if later), the batch extent
  // printed as N, and its parameter count. Ends with the total.
  std::string describe() const override;
  void train(bool on) override;
  void set_precision(Precision p) override;
  void set_memory_format(MemoryFormat f) override;
  Tensor backward_input(const Tensor& dy) override;  // every layer's, in reverse
  void backward_weight() override;                   // every layer's, in reverse
  std::any take_saved() override;
  void restore_saved(std::any saved) override;
  void freeze_running_stats(bool frozen) override;

  // The input shape describe() assumes (the batch extent is ignored), e.g.
  // {1, 1, 28, 28}; forward() sets it too.
  void set_input_shape(Shape shape) { input_shape_ = std::move(shape); have_input_shape_ = true; }

  std::size_t size() const noexcept { return layers_.size(); }
  Layer& operator[](std::size_t i) const { return *layers_.at(i); }

  // Activation recomputation over the whole model, as PyTorch's
  // checkpoint_sequential: regroups the layers into `segments` runs of
  // consecutive layers (as equal in count as they divide) and wraps every
  // run but the last, whose activations backward needs at once, in a
  // Recompute. Names, parameters and checkpoints stay the same. Throws
  // weft::InvalidArgument unless 1 <= segments <= size() (1: nothing is
  // recomputed).
  void recompute(int segments);

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
  Shape input_shape_;  // set_input_shape's, or the last forward's input
  bool have_input_shape_ = false;
};

// Activation recomputation (gradient checkpointing, Chen et al. 2016): a
// segment of layers that keeps only its input between forward and backward.
// A training forward runs the segment and drops what its layers kept;
// backward runs the forward again from the kept input, then the segment's
// backward, so its activations live only while its own backward runs, at
// the cost of one more forward. The recomputation runs with the running
// statistics frozen (freeze_running_stats), so batch norm counts each batch
// once and, in training mode, normalizes it by the same batch statistics:
// the gradients equal the segment's without recomputation. Everything else
// (parameters, buffers, precision, mode, shapes) is the segment's.
// DataParallel takes it as one layer (under Shard::parameters, its
// parameters are gathered together, for the forward and again for the
// recomputation and backward).
class Recompute : public Layer {
 public:
  explicit Recompute(std::unique_ptr<Sequential> segment);  // throws weft::InvalidArgument for null
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Tensor backward_input(const Tensor& dy) override;
  void backward_weight() override;
  std::vector<Parameter*> parameters() override;
  std::vector<Buffer*> buffers() override;
  std::vector<Parameter*> tied_parameters() override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;  // "Recompute(Dense(784 -> 512), ReLU, ...)"
  void train(bool on) override;
  void set_precision(Precision p) override;
  void set_memory_format(MemoryFormat f) override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;
  void freeze_running_stats(bool frozen) override;
  Sequential& segment() const noexcept { return *segment_; }

 private:
  void recompute_forward(const Tensor& dy);  // from x_, statistics frozen, once dy is written
  std::unique_ptr<Sequential> segment_;
  Tensor x_;                 // the training forward's input, until backward
  bool recomputed_ = false;  // backward_input ran: backward_weight is due
};

// Number of elements of all parameters.
std::int64_t parameter_count(const std::vector<Parameter*>& params);

// w -= lr * (grad + weight_decay * w) for every parameter (one ops::sgd_update
// each; weight decay applies to biases too). Throws weft::Error naming a
// parameter without a gradient.
void sgd_step(const std::vector<Parameter*>& params, float lr, float weight_decay = 0.0f);
// As above, every update skipped on the device when skip ([1] float32, a loss
// scaler's found-inf flag) is not zero when it runs.
void sgd_step(const std::vector<Parameter*>& params, float lr, float weight_decay, const Tensor& skip);

// D2L's LeNet with ReLU: conv 20x3x3 -> ReLU -> avgpool 2 -> conv 50x5x5 ->
// ReLU -> avgpool 2 -> flatten -> dense 800->128 -> ReLU -> dense 128->10.
// Input [N, 1, 28, 28], output logits [N, 10]. Kaiming init for the layers
// followed by a ReLU, Xavier for the last; layer i's seed is derive_seed(seed, i).
std::unique_ptr<Sequential> lenet(Engine& engine, Device device = {}, std::uint64_t seed = 0);

// Dense layers sizes[0] -> sizes[1] -> ... with a ReLU between consecutive
// ones and none after the last (sizes.size() >= 2, all positive). Init as lenet.
std::unique_ptr<Sequential> mlp(Engine& engine, std::vector<std::int64_t> sizes, Device device = {},
                                std::uint64_t seed = 0);

// ResNet-18 (He et al. 2016) as D2L builds it, one flat Sequential whose
// layers are the stem, eight Residual blocks and the head, so pipelines can
// split it between blocks:
//   stem, layer1.0, layer1.1 (64 channels), layer2.0 (stride 2, projection),
//   layer2.1 (128), layer3.0, layer3.1 (256), layer4.0, layer4.1 (512),
//   global average pooling, flatten, fc (512 -> classes).
// Stems:
//   small:    conv 3x3 stride 1 pad 1 -> BN -> ReLU. D2L's multi-GPU chapter
//             model for 28x28 Fashion-MNIST (about 0.9 GFLOP, 0.45 G
//             multiply-adds, per image forward: layer1 runs at 28x28).
//   imagenet: conv 7x7 stride 2 pad 3 -> BN -> ReLU -> max pool 3 stride 2
//             pad 1. D2L's ResNet chapter (inputs resized to 96x96) and the
//             paper's.
// Convolutions keep their biases, as D2L's do, and every weight starts as
// PyTorch's default (Init::fan_in_uniform), as D2L's model does. Names:
// "conv1", "bn1", "layer3.0.bn1", "fc"; parameter "layer3.0.bn1.weight".
// Block i's seed is derive_seed(seed, i).
enum class ResNetStem : std::uint8_t { small, imagenet };
struct ResNetOptions {
  std::int64_t in_channels = 1;
  std::int64_t classes = 10;
  ResNetStem stem = ResNetStem::small;
};
std::unique_ptr<Sequential> resnet18(Engine& engine, Device device = {}, std::uint64_t seed = 0,
                                     ResNetOptions options = {});

// ResNet-50 (He et al. 2016) in torchvision's layout (resnet50, v1.5), one
// flat Sequential as resnet18's: the stem, sixteen Bottleneck blocks and the
// head:
//   stem, layer1.0-2 (width 64, 256 channels out), layer2.0-3 (128, 512),
//   layer3.0-5 (256, 1024), layer4.0-2 (512, 2048), global average pooling,
//   flatten, fc (2048 -> classes).
// The first block of each stage has the projection shortcut and, from
// layer2 on, stride 2. Options mean what they mean to resnet18, the stem
// included (the defaults: the small stem, 1 channel, 10 classes), so the two
// models take the same data; the paper's ImageNet model, 25,557,032
// parameters as torchvision's, is
// ResNetOptions{.in_channels = 3, .classes = 1000, .stem = ResNetStem::imagenet}
// (describe() then assumes 224x224 inputs). No convolution has a bias, as in
// torchvision; fc has one. Initialization and seeds as resnet18's; the names
// ("layer3.0.conv2.weight", "layer3.0.downsample.1.running_mean") are
// torchvision's state_dict keys (it adds num_batches_tracked). Throws
// weft::InvalidArgument unless in_channels and classes are positive.
std::unique_ptr<Sequential> resnet50(Engine& engine, Device device = {}, std::uint64_t seed = 0,
                                     ResNetOptions options = {});

}  // namespace weft::nn

#include "weft/nn_transformer.h"  // IWYU pragma: export
