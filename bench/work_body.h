// The work every peer runs per op: a little real arithmetic on the op's data
// items (so a peer that drops, duplicates or reorders dependent ops changes the
// result) followed by calibrated busy work (so the op has a known cost).
//
// Every peer calls the same compute_op(), so the only thing that differs
// between peers is how ops are scheduled.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shapes.h"

namespace weft_bench {

// A body: how much busy work each op does after its arithmetic.
struct Body {
  std::string name;         // "empty", "1us", "10us"
  std::uint64_t spin_iters = 0;  // calibrated at start-up; 0 for "empty"
  int ops_divisor = 1;      // 10us runs use 1/8 of the ops so one run stays ~1 s
};

// splitmix64 finaliser: cheap, and every input bit affects every output bit.
inline std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A serial dependency chain of multiply-adds: its latency is what we calibrate.
// The empty asm keeps the compiler from vectorising it or computing the chain
// in closed form; folding the result into the item keeps it from being dropped.
inline std::uint64_t spin(std::uint64_t v, std::uint64_t iters) noexcept {
  for (std::uint64_t k = 0; k < iters; ++k) {
    v = v * 6364136223846793005ULL + 1442695040888963407ULL;
    asm volatile("" : "+r"(v));
  }
  return v;
}

// The value op `op` writes, given the values it reads (in op.reads order).
// Reads are combined non-commutatively so swapped inputs are caught too.
inline std::uint64_t compute_op(const Op& op, std::uint64_t in0, std::uint64_t in1, std::uint64_t spin_iters) noexcept {
  std::uint64_t v = mix64(op.tag);
  if (op.nreads > 0) v = mix64(v ^ in0);
  if (op.nreads > 1) v = mix64(v + 3 * in1);
  return spin(v, spin_iters);
}

// Runs one op directly on the items array (every peer but StarPU, which gets
// its data through StarPU's buffers, calls this).
inline void run_op(const Op& op, std::uint64_t* items, std::uint64_t spin_iters) noexcept {
  const std::uint64_t in0 = op.nreads > 0 ? items[op.reads[0]] : 0;
  const std::uint64_t in1 = op.nreads > 1 ? items[op.reads[1]] : 0;
  items[op.write] = compute_op(op, in0, in1, spin_iters);
}

// Before each run: a fixed pattern, so an op that never ran leaves a
// different value behind and the checksum notices.
inline void reset_items(std::uint64_t* items, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) items[i] = 0x5eed0000ULL + i;
}

// Position-sensitive, so values landing in the wrong item are caught too.
inline std::uint64_t checksum_items(const std::uint64_t* items, std::size_t n) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ mix64(items[i] + i)) * 0x100000001b3ULL;
  return h;
}

}  // namespace weft_bench
