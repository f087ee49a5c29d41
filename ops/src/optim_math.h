// The optimizer step's arithmetic, shared by the CPU kernel (cpu/optim.cpp)
// and the CUDA kernels (gpu/optim.cu) so both compute the same bits. Each
// element's update runs in float32, as PyTorch's fused optimizers do (its
// opmath type for float32 parameters): the step's constants come from the
// host in float32 (each rounded once from double), the per-tensor bias
// corrections are computed in double from the step count and rounded once,
// and every element operation is a separately rounded IEEE float32 one (the
// _rn intrinsics on the device, where nvcc would otherwise contract a * b + c
// into an FMA). Powers use repeated squaring (the same operation sequence on
// both, unlike pow()). docs/design/optimizers.md says how far this is from a
// float64 run.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define WEFT_OPTIM_HD __host__ __device__ __forceinline__
#else
#define WEFT_OPTIM_HD inline
#endif

namespace weft::kernels {

enum class OptimizerKind : std::int32_t { sgd, sgd_momentum, adam, adamw };

// One step's constants, computed on the host (lr is the step's rate) in
// double from the float32 options and rounded to float32 once each.
struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::sgd;
  std::int32_t nesterov = 0;
  float lr = 0.0f;
  float weight_decay = 0.0f;  // sgd, adam: added to the gradient (0: not at all)
  float decay = 1.0f;         // adamw: w *= decay = 1 - lr * weight_decay first
  float momentum = 0.0f, one_minus_dampening = 1.0f;
  float beta1 = 0.9f, beta2 = 0.999f, one_minus_beta1 = 0.1f, one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
};

// One parameter of a step: its value, states (s0: momentum_buffer or
// exp_avg; s1: exp_avg_sq; null where the algorithm keeps fewer), its step
// counter (null for plain sgd) and gradient, n elements each.
struct OptimizerTensor {
  float* w = nullptr;
  float* s0 = nullptr;
  float* s1 = nullptr;
  float* step = nullptr;
  const float* g = nullptr;
  std::int64_t n = 0;
};

namespace optim_math {

// float32 operations, each rounded once.
WEFT_OPTIM_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
WEFT_OPTIM_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
WEFT_OPTIM_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
WEFT_OPTIM_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
WEFT_OPTIM_HD float sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);
#endif
}

// double operations for the per-tensor constants.
WEFT_OPTIM_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
WEFT_OPTIM_HD double dsub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
WEFT_OPTIM_HD double ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
WEFT_OPTIM_HD double dsqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return __builtin_sqrt(a);
#endif
}

// b^t for an integer t >= 0 by repeated squaring, in double.
WEFT_OPTIM_HD double power(double b, std::int64_t t) {
  double r = 1.0;
  while (t > 0) {
    if (t & 1) r = dmul(r, b);
    b = dmul(b, b);
    t >>= 1;
  }
  return r;
}

// Per tensor and step: what the elements need from the step count t (from
// 1), computed in double and rounded to float32 once.
struct StepConstants {
  float step_size = 0.0f;  // adam: lr / (1 - beta1^t)
  float bc2_sqrt = 1.0f;   // adam: sqrt(1 - beta2^t)
  bool first = false;      // t == 1: momentum sgd's buffer starts as the gradient
};

WEFT_OPTIM_HD StepConstants constants(const OptimizerHyper& h, float counter) {
  StepConstants c;
  const auto t = static_cast<std::int64_t>(counter) + 1;
  c.first = t == 1;
  if (h.kind == OptimizerKind::adam || h.kind == OptimizerKind::adamw) {
    c.step_size = static_cast<float>(ddiv(h.lr, dsub(1.0, power(h.beta1, t))));
    c.bc2_sqrt = static_cast<float>(dsqrt(dsub(1.0, power(h.beta2, t))));
  }
  return c;
}

// One element: its weight w and states s0, s1 (updated in place; a state the
// algorithm does not keep is left alone) and gradient g; `scale` multiplies
// the gradient. float32 from load to store.
WEFT_OPTIM_HD void update_values(const OptimizerHyper& h, const StepConstants& c, float scale, float& w_io, float g_in,
                                 float& s0, float& s1) {
  float w = w_io;
  float g = mul(g_in, scale);
  switch (h.kind) {
    case OptimizerKind::sgd:
      if (h.weight_decay != 0.0f) g = add(g, mul(h.weight_decay, w));
      w_io = sub(w, mul(h.lr, g));
      return;
    case OptimizerKind::sgd_momentum: {
      if (h.weight_decay != 0.0f) g = add(g, mul(h.weight_decay, w));
      const float b = c.first ? g : add(mul(h.momentum, s0), mul(h.one_minus_dampening, g));
      s0 = b;
      g = h.nesterov ? add(g, mul(h.momentum, b)) : b;
      w_io = sub(w, mul(h.lr, g));
      return;
    }
    case OptimizerKind::adam:
    case OptimizerKind::adamw: {
      if (h.kind == OptimizerKind::adamw)
        w = mul(w, h.decay);
      else if (h.weight_decay != 0.0f)
        g = add(g, mul(h.weight_decay, w));
      const float m = add(mul(h.beta1, s0), mul(h.one_minus_beta1, g));
      const float v = add(mul(h.beta2, s1), mul(h.one_minus_beta2, mul(g, g)));
      s0 = m;
      s1 = v;
      const float denom = add(div(sqrt(v), c.bc2_sqrt), h.eps);
      w_io = sub(w, mul(c.step_size, div(m, denom)));
      return;
    }
  }
}

// Element i of one tensor.
WEFT_OPTIM_HD void update(const OptimizerHyper& h, const StepConstants& c, const OptimizerTensor& p, float scale,
                          std::int64_t i) {
  float w = p.w[i];
  float s0 = p.s0 != nullptr ? p.s0[i] : 0.0f, s1 = p.s1 != nullptr ? p.s1[i] : 0.0f;
  update_values(h, c, scale, w, p.g[i], s0, s1);
  p.w[i] = w;
  if (p.s0 != nullptr) p.s0[i] = s0;
  if (p.s1 != nullptr) p.s1[i] = s1;
}

// torch.nn.utils.clip_grad_norm_'s coefficient, clamped to 1 (NaN stays NaN).
WEFT_OPTIM_HD float clip_coefficient(float norm_sq, float max_norm) {
#if defined(__CUDA_ARCH__)
  const float coef = __fdiv_rn(max_norm, __fadd_rn(__fsqrt_rn(norm_sq), 1e-6f));
#else
  const float coef = max_norm / (__builtin_sqrtf(norm_sq) + 1e-6f);
#endif
  return coef > 1.0f ? 1.0f : coef;
}

}  // namespace optim_math
}  // namespace weft::kernels
