// weft::nn transformer layers and a GPT-2-style model (included by
// weft/nn.h). Activations are [B, T, C] (batch, sequence, width); token ids
// and targets [B, T] as float32. Under bf16 / fp16 the residual stream and
// layer norm stay float32 (as PyTorch's autocast runs them), the Dense
// layers and attention compute in the half type, and each block casts its
// branches back before adding them. How the layers are built, and how
// weight tying works with DataParallel and Pipeline:
// docs/design/transformer.md.
#pragma once

#include <any>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weft::nn {

// Layer normalization over the last dimension ([..., C]): parameters
// "<name>.weight" (1) and "<name>.bias" (0), float32; statistics float32
// whatever the input's dtype, the output in the input's.
class LayerNorm : public Layer {
 public:
  LayerNorm(Engine& engine, std::int64_t width, Device device = {}, std::string name = "ln", float eps = 1e-5f);
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  std::int64_t width_;
  float eps_;
  Parameter weight_, bias_;
  Tensor x_, mean_, rstd_;
};

// GELU, tanh form (GPT-2's), in the input's dtype.
class GELU : public Layer {
 public:
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Shape output_shape(const Shape& input) const override { return input; }
  std::string describe() const override { return "GELU(tanh)"; }
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  Tensor x_;
};

// Token embedding: ids [B, T] (float32 row indices) -> weight's rows
// [B, T, width], float32. Parameter "<name>.weight" [vocab, width], U(-a, a)
// with standard deviation `stddev`. An id outside [0, vocab) fails the op,
// naming the ids, the position and the vocabulary. Backward returns zeros
// for the ids (they take no gradient) and adds, to its weight's gradient,
// what tied users of the weight (LMHead) computed since the last backward.
class Embedding : public Layer {
 public:
  Embedding(Engine& engine, std::int64_t vocab, std::int64_t width, Device device = {}, std::uint64_t seed = 0,
            std::string name = "wte", float stddev = 0.02f);
  Tensor forward(const Tensor& ids) override;
  Tensor backward(const Tensor& dy) override;
  Tensor backward_input(const Tensor& dy) override;
  void backward_weight() override;
  std::vector<Parameter*> parameters() override { return {&weight_}; }
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

  Parameter& weight() noexcept { return weight_; }
  std::int64_t vocab() const noexcept { return vocab_; }
  std::int64_t width() const noexcept { return width_; }
  // For a layer that computes with weight() too: its gradient for the
  // weight (float32 [vocab, width], any device), added into the weight's
  // gradient by this layer's next backward.
  void add_tied_gradient(const Tensor& g);

 private:
  std::int64_t vocab_, width_;
  Parameter weight_;
  Tensor ids_, dy_;
  Tensor tied_grad_;  // the sum of add_tied_gradient's since the last backward
};

// Learned positions: x [B, T, width] -> x + weight[t] at each t < T.
// Parameter "<name>.weight" [context, width]. T > context is a weft::Error
// naming the input, its sequence length and the context.
class PositionalEmbedding : public Layer {
 public:
  PositionalEmbedding(Engine& engine, std::int64_t context, std::int64_t width, Device device = {},
                      std::uint64_t seed = 0, std::string name = "wpe", float stddev = 0.02f);
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Tensor backward_input(const Tensor& dy) override;
  void backward_weight() override;
  std::vector<Parameter*> parameters() override { return {&weight_}; }
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  Tensor positions(std::int64_t batch, std::int64_t seq, Device device);  // [B, T] ids 0..T-1, kept per shape
  std::int64_t context_, width_;
  Parameter weight_;
  Tensor pos_;  // the last positions made
  Tensor saved_pos_, dy_;
};

// Causal multi-head self-attention, GPT-2's: [B, T, C] -> [B, T, C];
// c_attn Dense(C, 3C) gives q, k and v (in that order, each H heads of
// C / H), ops::causal_attention with scale 1 / sqrt(C / H), the heads
// merged and c_proj Dense(C, C). Parameters "<name>.c_attn.weight", ... .
// Heads that do not divide the width are a weft::InvalidArgument naming
// both.
class MultiHeadAttention : public Layer {
 public:
  MultiHeadAttention(Engine& engine, std::int64_t width, std::int64_t heads, Device device = {},
                     std::uint64_t seed = 0, std::string name = "attn", float stddev = 0.02f,
                     float proj_stddev = 0.02f);
  ~MultiHeadAttention() override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Tensor backward_input(const Tensor& dy) override;
  void backward_weight() override;
  std::vector<Parameter*> parameters() override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  void train(bool on) override;
  void set_precision(Precision p) override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  struct Saved;
  std::int64_t width_, heads_;
  std::unique_ptr<Dense> c_attn_, c_proj_;
  std::unique_ptr<Saved> saved_;
};

// A pre-norm transformer block (GPT-2's):
//   x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
// mlp: c_fc Dense(C, 4C) -> GELU -> c_proj Dense(4C, C). Names
// "<name>.ln_1.weight", "<name>.attn.c_attn.weight", "<name>.mlp.c_fc.weight".
// c_proj weights start with standard deviation proj_stddev (GPT-2:
// 0.02 / sqrt(2 * layers)).
class TransformerBlock : public Layer {
 public:
  TransformerBlock(Engine& engine, std::int64_t width, std::int64_t heads, Device device = {},
                   std::uint64_t seed = 0, std::string name = "h", float stddev = 0.02f, float proj_stddev = 0.02f,
                   float eps = 1e-5f);
  ~TransformerBlock() override;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Tensor backward_input(const Tensor& dy) override;
  void backward_weight() override;
  std::vector<Parameter*> parameters() override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  void train(bool on) override;
  void set_precision(Precision p) override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  std::vector<Layer*> children() const;
  std::int64_t width_, heads_;
  std::unique_ptr<LayerNorm> ln_1_, ln_2_;
  std::unique_ptr<MultiHeadAttention> attn_;
  std::unique_ptr<Dense> c_fc_, c_proj_;
  GELU gelu_;
  DType residual_dtype_ = DType::float32;  // of the last forward's input
};

// The output projection: x [B, T, C] -> logits [B, T, vocab] = x W^T, no
// bias. Tied (the constructor with an Embedding): W is the embedding's
// weight, read at each use (on another device, copied there), and the
// gradient for it goes to the embedding (Embedding::add_tied_gradient) in
// backward_input, so it is there before the embedding's own backward;
// parameters() is then empty and tied_parameters() names it. Untied: its
// own "<name>.weight" [vocab, C].
class LMHead : public Layer {
 public:
  LMHead(Embedding& tied, std::string name = "lm_head");
  LMHead(Engine& engine, std::int64_t width, std::int64_t vocab, Device device = {}, std::uint64_t seed = 0,
         std::string name = "lm_head", float stddev = 0.02f);
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy) override;
  Tensor backward_input(const Tensor& dy) override;
  void backward_weight() override;
  std::vector<Parameter*> parameters() override;
  std::vector<Parameter*> tied_parameters() override;
  Shape output_shape(const Shape& input) const override;
  std::string describe() const override;
  std::any take_saved() override;
  void restore_saved(std::any saved) override;

 private:
  const Parameter& weight() const;
  Embedding* tied_ = nullptr;
  std::int64_t width_, vocab_;
  std::string name_;
  Parameter own_;  // untied only
  Tensor x_, w_, dy_;  // x_: [B*T, C] in the compute dtype; w_: a half or moved copy of the weight
  Shape out_;          // the last forward's [B, T, vocab]
};

// GPT-2's shapes (Radford et al. 2019).
struct GptConfig {
  std::int64_t vocab = 50257;
  std::int64_t context = 1024;
  std::int64_t layers = 12;
  std::int64_t heads = 12;
  std::int64_t width = 768;
  bool tie_weights = true;  // lm_head computes with wte's weight
  float layer_norm_eps = 1e-5f;
  static GptConfig small();  // GPT-2 small (the defaults): 124,439,808 parameters tied
  static GptConfig tiny();   // bytes: vocab 256, context 128, 4 layers, 4 heads, width 128
  std::string describe() const;  // "layers 4, heads 4, width 128, context 128, vocab 256"
};

// One flat Sequential, so DataParallel (every Shard), Pipeline (blocks as
// stages) and capture take it:
//   wte (Embedding), wpe (PositionalEmbedding), h.0 ... h.{layers-1}
//   (TransformerBlock), ln_f (LayerNorm), lm_head (LMHead).
// Input token ids [B, T] (float32, T <= context), output logits
// [B, T, vocab]. Weights U(-a, a) with GPT-2's standard deviations (0.02;
// the blocks' c_proj 0.02 / sqrt(2 * layers)), biases 0, layer norms 1 and
// 0; layer i's seed derive_seed(seed, i). Names as GPT-2's
// ("h.3.attn.c_attn.weight"). Throws weft::InvalidArgument for a
// non-positive size or heads that do not divide the width.
std::unique_ptr<Sequential> gpt(Engine& engine, const GptConfig& config, Device device = {},
                                std::uint64_t seed = 0);

// The language-model loss: logits [B, T, V] (any floating dtype), targets
// [B, T] (ids as float32) -> the mean cross-entropy over the B * T tokens
// (scalar float32, nats) and dlogits [B, T, V] float32. A target outside
// [0, V) fails the op.
ops::SoftmaxCrossEntropy lm_loss(const Tensor& logits, const Tensor& targets);

}  // namespace weft::nn
