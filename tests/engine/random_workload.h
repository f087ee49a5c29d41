// The random workload of the differential tests (MXNet's engine tests'
// style), shared by the pushed and the captured-and-replayed forms: ops over
// kVars uint64 variables, each reading 0-8 variables and writing one, the
// written value a strong hash of what it read and its index, so any
// reordering of conflicting ops changes the final values.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine_test_util.h"
#include "weft/engine.h"

namespace weft_test {

inline constexpr int kVars = 100;
inline constexpr int kOps = 100'000;
inline constexpr int kMaxReads = 8;

struct OpSpec {
  std::uint32_t index;  // global op number, mixed into the result
  std::uint8_t write;
  std::uint8_t nreads;
  std::uint8_t device;  // taken modulo the engine's CPU devices
  std::int8_t priority;
  bool async;
  std::array<std::uint8_t, kMaxReads> reads;
};

// The op body: cheap, and sensitive to the exact values it reads.
inline void apply(const OpSpec& op, std::uint64_t* values) {
  std::uint64_t h = mix64(op.index * 0x2545F4914F6CDD1Dull);
  for (int i = 0; i < op.nreads; ++i) h = mix64(h ^ (values[op.reads[i]] + static_cast<std::uint64_t>(i)));
  values[op.write] = h;
}

// Ops writing one of `writable`, reading from `readable` (with duplicates and,
// often, the written variable itself).
inline std::vector<OpSpec> make_ops(std::uint64_t seed, int n, std::uint32_t first_index, const std::vector<int>& writable,
                             const std::vector<int>& readable) {
  SplitMix rng(seed);
  std::vector<OpSpec> ops(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    OpSpec& op = ops[static_cast<std::size_t>(i)];
    op.index = first_index + static_cast<std::uint32_t>(i);
    op.write = static_cast<std::uint8_t>(writable[rng.below(static_cast<std::uint32_t>(writable.size()))]);
    op.nreads = static_cast<std::uint8_t>(rng.below(kMaxReads + 1));
    for (int r = 0; r < op.nreads; ++r) {
      op.reads[r] = rng.below(4) == 0 ? op.write
                                      : static_cast<std::uint8_t>(
                                            readable[rng.below(static_cast<std::uint32_t>(readable.size()))]);
    }
    op.device = static_cast<std::uint8_t>(rng.below(3));
    op.priority = static_cast<std::int8_t>(static_cast<int>(rng.below(5)) - 2);
    op.async = rng.below(16) == 0;
  }
  return ops;
}

inline std::vector<std::uint64_t> initial_values(std::uint64_t seed) {
  std::vector<std::uint64_t> v(kVars);
  for (int i = 0; i < kVars; ++i) v[static_cast<std::size_t>(i)] = mix64(seed * 1000 + static_cast<std::uint64_t>(i));
  return v;
}

inline void run_serial(const std::vector<OpSpec>& ops, std::vector<std::uint64_t>& values, std::vector<std::uint64_t>& writes) {
  for (const OpSpec& op : ops) {
    apply(op, values.data());
    ++writes[op.write];
  }
}

inline void push_ops(weft::Engine& e, const Config& cfg, const std::vector<OpSpec>& ops, const std::vector<Var>& vars,
              std::uint64_t* values) {
  for (const OpSpec& op : ops) {
    std::array<Var, kMaxReads> reads;
    const std::size_t n = std::min<std::size_t>(op.nreads, kMaxReads);
    for (std::size_t r = 0; r < n; ++r) reads[r] = vars[op.reads[r]];
    const Device device = Device::cpu(op.device % cfg.cpu_devices);
    const std::span<const Var> read_list(reads.data(), n);
    const weft::OpOptions options{.priority = op.priority};
    if (op.async) {
      e.push_async(
          [spec = &op, values](RunContext&, Completion done) {
            apply(*spec, values);
            done();
          },
          device, read_list, vars[op.write], options);
    } else {
      e.push([spec = &op, values](RunContext&) { apply(*spec, values); }, device, read_list, vars[op.write],
             options);
    }
  }
}

inline std::vector<int> range(int first, int count) {
  std::vector<int> v;
  for (int i = 0; i < count; ++i) v.push_back(first + i);
  return v;
}


// The workload's variables, and their versions once the work is done.
inline std::vector<Var> new_vars(weft::Engine& e, int n = kVars) {
  std::vector<Var> vars;
  for (int i = 0; i < n; ++i) vars.push_back(e.new_var());
  return vars;
}
inline std::vector<std::uint64_t> versions_of(const weft::Engine& e, const std::vector<Var>& vars) {
  std::vector<std::uint64_t> out;
  for (const Var& v : vars) out.push_back(e.version(v));
  return out;
}

// Every value and every version equals the oracle's (counted, so a failure
// reports how many differ instead of 100 lines).
template <class Values, class Versions>
void check_against_oracle(const Values& values, const Values& expected, const Versions& versions,
                          const Versions& expected_writes) {
  int value_mismatches = 0, version_mismatches = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    value_mismatches += values[i] != expected[i];
    version_mismatches += versions[i] != expected_writes[i];
  }
  CHECK(value_mismatches == 0);
  CHECK(version_mismatches == 0);
}

}  // namespace weft_test
