// The optimizer step's arithmetic, shared by the CPU kernel (cpu/optim.cpp)
// and the CUDA kernels (gpu/optim.cu) so both compute the same bits. Each
// element's update runs in double from the float32 value, states and
// gradient, and each stored value is rounded to float32 once per step (so
// the weights drift from a float64 run by one rounding per step, not
// several). Every operation is a separately rounded IEEE one (the _rn
// intrinsics on the device, where nvcc would otherwise contract a * b + c
// into an FMA), and the bias corrections 1 - beta^t use powers by repeated
// squaring (the same operation sequence on both, unlike pow()).
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

// One step's constants, computed on the host (lr is the step's rate), as
// doubles of the float32 options (1 - x computed in double).
struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::sgd;
  std::int32_t nesterov = 0;
  double lr = 0.0;
  double weight_decay = 0.0;  // sgd, adam: added to the gradient (0: not at all)
  double decay = 1.0;         // adamw: w *= decay = 1 - lr * weight_decay first
  double momentum = 0.0, one_minus_dampening = 1.0;
  double beta1 = 0.9, beta2 = 0.999, one_minus_beta1 = 0.1, one_minus_beta2 = 0.001;
  double eps = 1e-8;
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

WEFT_OPTIM_HD double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
WEFT_OPTIM_HD double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
WEFT_OPTIM_HD double sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
WEFT_OPTIM_HD double div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
WEFT_OPTIM_HD double sqrt(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return __builtin_sqrt(a);
#endif
}

// b^t for an integer t >= 0 by repeated squaring.
WEFT_OPTIM_HD double power(double b, std::int64_t t) {
  double r = 1.0;
  while (t > 0) {
    if (t & 1) r = mul(r, b);
    b = mul(b, b);
    t >>= 1;
  }
  return r;
}

// Per tensor and step: what the elements need from the step count t (from 1).
struct StepConstants {
  double step_size = 0.0;  // adam: lr / (1 - beta1^t)
  double bc2_sqrt = 1.0;   // adam: sqrt(1 - beta2^t)
  bool first = false;      // t == 1: momentum sgd's buffer starts as the gradient
};

WEFT_OPTIM_HD StepConstants constants(const OptimizerHyper& h, float counter) {
  StepConstants c;
  const auto t = static_cast<std::int64_t>(counter) + 1;
  c.first = t == 1;
  if (h.kind == OptimizerKind::adam || h.kind == OptimizerKind::adamw) {
    c.step_size = div(h.lr, sub(1.0, power(h.beta1, t)));
    c.bc2_sqrt = sqrt(sub(1.0, power(h.beta2, t)));
  }
  return c;
}

// Element i of one tensor; `scale` multiplies the gradient. Each stored
// value is rounded to float32 once.
WEFT_OPTIM_HD void update(const OptimizerHyper& h, const StepConstants& c, const OptimizerTensor& p, float scale,
                          std::int64_t i) {
  double w = p.w[i];
  double g = mul(p.g[i], scale);
  switch (h.kind) {
    case OptimizerKind::sgd:
      if (h.weight_decay != 0.0) g = add(g, mul(h.weight_decay, w));
      p.w[i] = static_cast<float>(sub(w, mul(h.lr, g)));
      return;
    case OptimizerKind::sgd_momentum: {
      if (h.weight_decay != 0.0) g = add(g, mul(h.weight_decay, w));
      const double b = c.first ? g : add(mul(h.momentum, p.s0[i]), mul(h.one_minus_dampening, g));
      p.s0[i] = static_cast<float>(b);
      g = h.nesterov ? add(g, mul(h.momentum, b)) : b;
      p.w[i] = static_cast<float>(sub(w, mul(h.lr, g)));
      return;
    }
    case OptimizerKind::adam:
    case OptimizerKind::adamw: {
      if (h.kind == OptimizerKind::adamw)
        w = mul(w, h.decay);
      else if (h.weight_decay != 0.0)
        g = add(g, mul(h.weight_decay, w));
      const double m = add(mul(h.beta1, p.s0[i]), mul(h.one_minus_beta1, g));
      const double v = add(mul(h.beta2, p.s1[i]), mul(h.one_minus_beta2, mul(g, g)));
      p.s0[i] = static_cast<float>(m);
      p.s1[i] = static_cast<float>(v);
      const double denom = add(div(sqrt(v), c.bc2_sqrt), h.eps);
      p.w[i] = static_cast<float>(sub(w, mul(c.step_size, div(m, denom))));
      return;
    }
  }
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
