// The seeded random inputs the ops tests share.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace weft_test {

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(std::uint64_t seed) : gen(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {  // inclusive
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen);
  }
  std::vector<float> vec(std::int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = uniform(lo, hi);
    return v;
  }
};

}  // namespace weft_test
