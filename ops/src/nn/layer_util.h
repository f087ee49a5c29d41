// Helpers the nn layers share (ops/src/nn/*.cpp): initialization, the
// checks and messages of forward/backward, and the precision rules.
#pragma once

#include <any>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "describe.h"
#include "weft/error.h"
#include "weft/nn.h"

namespace weft::nn::layer_util {

inline std::string num(std::int64_t v) { return std::to_string(v); }

// The bound a of U(-a, a) for a layer with these fans.
inline float init_bound(Init init, std::int64_t fan_in, std::int64_t fan_out) {
  switch (init) {
    case Init::kaiming_uniform:
      return static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in)));
    case Init::xavier_uniform:
      return static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
    case Init::fan_in_uniform:
      return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  }
  throw InvalidArgument("nn: unknown Init");
}

inline Parameter make_weight(Engine& engine, const std::string& name, Shape shape, Init init, std::int64_t fan_in,
                             std::int64_t fan_out, Device device, std::uint64_t seed) {
  const float a = init_bound(init, fan_in, fan_out);
  Tensor w = Tensor::uniform(engine, std::move(shape), -a, a, seed, device);
  w.set_name(name + ".weight").set_role(MemoryRole::parameters);
  return Parameter{name + ".weight", std::move(w), Tensor()};
}

inline Parameter make_bias(Engine& engine, const std::string& name, std::int64_t n, Device device) {
  Tensor b = Tensor::zeros(engine, Shape{n}, device);
  b.set_name(name + ".bias").set_role(MemoryRole::parameters);
  return Parameter{name + ".bias", std::move(b), Tensor()};
}

inline void check_positive(const char* layer, const char* what, std::int64_t v) {
  if (v < 1) throw InvalidArgument(std::string(layer) + ": " + what + " must be positive, got " + num(v));
}

[[noreturn]] inline void no_forward(const std::string& layer) {
  throw InvalidArgument(layer + ": backward without a training-mode forward before it (backward consumes what forward "
                        "kept; evaluation mode keeps nothing)");
}

inline void check_dy(const std::string& layer, const Tensor& dy, const Shape& want) {
  if (!dy.defined()) throw InvalidArgument(layer + ": backward got an undefined dy");
  if (dy.shape() != want)
    throw InvalidArgument(layer + ": backward got dy " + detail::describe(dy) + ", the last forward's output is " +
                          want.str());
}

// Runs a shape check, adding the input tensor (its name, shape and device)
// to the message.
template <class Check>
inline void check_input(const Tensor& x, Check check) {
  if (!x.defined()) throw InvalidArgument("nn: undefined input");
  try {
    check();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(e.what()) + " (input: " + x.str() + ")");
  }
}

template <class T>
inline T saved_as(std::any& saved, const char* layer) {
  if (!saved.has_value()) return T{};
  T* v = std::any_cast<T>(&saved);
  if (!v) throw InvalidArgument(std::string(layer) + "::restore_saved: not what this kind of layer's take_saved gave");
  return std::move(*v);
}

inline void no_backward_input(const std::string& layer) {
  throw InvalidArgument(layer + ": backward_weight without a backward_input before it");
}

// t in `dtype` (itself when it already is).
inline Tensor as_dtype(const Tensor& t, DType dtype) {
  return !t.defined() || t.dtype() == dtype ? t : ops::cast(t, dtype);
}

// What forward keeps of the weight it computed with: only a half copy. The
// float32 weight itself is read again at backward (weight_for_backward),
// so the layer holds no handle on it in between and a data-parallel
// trainer may free it and gather it again (ZeRO stage 3).
inline Tensor half_copy(const Tensor& computed_with, const Tensor& weight) {
  return computed_with.storage() == weight.storage() ? Tensor() : computed_with;
}
inline Tensor weight_for_backward(const Tensor& kept, const Tensor& weight) { return kept.defined() ? kept : weight; }

// A gradient for a float32 master parameter.
inline Tensor master_grad(Tensor g, const std::string& name) {
  g = as_dtype(g, DType::float32);
  g.set_name(name + ".grad").set_role(MemoryRole::gradients);  // traces and tables show "fc1.weight.grad"
  return g;
}

// The layer's math for its GEMMs / convolutions: TF32 exactly under tf32.
struct MathScope {
  explicit MathScope(Precision p) : tf32(p == Precision::tf32) {}
  ops::AllowTf32 tf32;
};

}  // namespace weft::nn::layer_util
