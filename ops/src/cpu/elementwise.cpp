// Elementwise kernels, the SGD step included. Memory bound, so plain loops the compiler vectorizes,
// split into pieces across the arena. Outputs may alias inputs (in-place
// ops): every element reads only its own index.
#include <atomic>
#include <cmath>
#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"

namespace weft::kernels::cpu {
namespace {

template <class F>
void map2(float* y, const float* a, const float* b, std::int64_t n, F f) {
  detail::parallel_for(n, detail::grain_for(1), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) y[i] = f(a[i], b[i]);
  });
}

template <class F>
void map1(float* y, const float* x, std::int64_t n, F f) {
  detail::parallel_for(n, detail::grain_for(1), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) y[i] = f(x[i]);
  });
}

}  // namespace

void add(float* y, const float* a, const float* b, std::int64_t n) {
  map2(y, a, b, n, [](float u, float v) { return u + v; });
}
void sub(float* y, const float* a, const float* b, std::int64_t n) {
  map2(y, a, b, n, [](float u, float v) { return u - v; });
}
void mul(float* y, const float* a, const float* b, std::int64_t n) {
  map2(y, a, b, n, [](float u, float v) { return u * v; });
}
void maximum(float* y, const float* a, const float* b, std::int64_t n) {
  map2(y, a, b, n, [](float u, float v) { return u < v ? v : u; });
}
void add_scalar(float* y, const float* x, float s, std::int64_t n) {
  map1(y, x, n, [s](float u) { return u + s; });
}
void mul_scalar(float* y, const float* x, float s, std::int64_t n) {
  map1(y, x, n, [s](float u) { return u * s; });
}
void axpy(float* y, float alpha, const float* x, std::int64_t n) {
  map2(y, y, x, n, [alpha](float u, float v) { return u + alpha * v; });
}
void relu(float* y, const float* x, std::int64_t n) {
  map1(y, x, n, [](float u) { return u > 0.0f ? u : 0.0f; });
}
void relu_grad(float* dx, const float* x, const float* dy, std::int64_t n) {
  map2(dx, x, dy, n, [](float u, float g) { return u > 0.0f ? g : 0.0f; });
}

void sgd_update(float* w, const float* g, std::int64_t n, float lr, float weight_decay, const float* skip) {
  if (skip && *skip != 0.0f) return;
  map2(w, w, g, n, [lr, weight_decay](float u, float gu) { return u - lr * (gu + weight_decay * u); });
}

void unscale_and_check(float* x, std::int64_t n, const float* scale, float* found_inf) {
  const float inv = 1.0f / *scale;
  std::atomic<bool> bad{false};
  detail::parallel_for(n, detail::grain_for(2), [&](std::int64_t begin, std::int64_t end) {
    bool local = false;
    for (std::int64_t i = begin; i < end; ++i) {
      local |= !std::isfinite(x[i]);
      x[i] *= inv;
    }
    if (local) bad.store(true, std::memory_order_relaxed);
  });
  if (bad.load()) *found_inf = 1.0f;
}

void update_loss_scale(float* scale, float* growth_tracker, float* skipped, const float* found_inf, float growth,
                       float backoff, std::int64_t interval) {
  if (*found_inf != 0.0f) {
    *scale *= backoff;
    *growth_tracker = 0.0f;
    *skipped += 1.0f;
    return;
  }
  *growth_tracker += 1.0f;
  if (*growth_tracker >= static_cast<float>(interval)) {
    *scale *= growth;
    *growth_tracker = 0.0f;
  }
}

}  // namespace weft::kernels::cpu
