// Counter-based random numbers: element i of a tensor seeded with s is a pure
// function of (s, i), so CPU and GPU kernels, and any split of the work across
// threads, produce the same values (up to the last-bit rounding of logf/cosf).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif

namespace weft::kernels {

// splitmix64's finalizer over (seed, counter): a well-mixed 64-bit value.
WEFT_HOST_DEVICE inline std::uint64_t mix(std::uint64_t seed, std::uint64_t counter) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + counter * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 random bits (exactly representable as float).
WEFT_HOST_DEVICE inline float uniform01(std::uint64_t seed, std::uint64_t counter) {
  return static_cast<float>(mix(seed, counter) >> 40) * (1.0f / 16777216.0f);
}

// Standard normal for element i: Box-Muller on two uniforms drawn from the
// element's own counters (2i, 2i + 1); the first uniform is kept away from 0
// ((k + 1) / 2^24 for k in [0, 2^24): in (0, 1]). The scale is written as a
// hex literal: `1.0f / 16777217.0f` was meant to be 2^-24 (16777217.0f rounds
// to 2^24 on the host), but nvcc folded it from the unrounded literal into
// 2^-24 - 2^-48, one ulp lower, and logf(u1) near 1 then differed from the
// CPU's by ~1e-3 relative (seen on an H200, 2026-11-26).
WEFT_HOST_DEVICE inline float standard_normal(std::uint64_t seed, std::uint64_t i) {
  const float u1 = (static_cast<float>(mix(seed, 2 * i) >> 40) + 1.0f) * 0x1p-24f;
  const float u2 = uniform01(seed, 2 * i + 1);
#if defined(__CUDA_ARCH__)
  return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
#else
  return __builtin_sqrtf(-2.0f * __builtin_logf(u1)) * __builtin_cosf(6.283185307179586f * u2);
#endif
}

}  // namespace weft::kernels
