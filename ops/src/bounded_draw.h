// The unbiased bounded draw behind the host-side data order (dataset.cpp's
// shuffle, text_corpus.cpp's batch offsets): the same values with every
// standard library, unlike std::uniform_int_distribution.
#pragma once

#include <cstdint>
#include <random>

namespace weft::detail {

// Uniform in [0, n), n > 0: rejection of the low 2^64 mod n values.
inline std::uint64_t bounded_draw(std::mt19937_64& g, std::uint64_t n) {
  const std::uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  for (;;) {
    const std::uint64_t r = g();
    if (r >= threshold) return r % n;
  }
}

}  // namespace weft::detail
