// Differential tests in the style of MXNet's engine tests: random workloads of
// 100,000 ops over 100 uint64 variables, each op reading 0-8 variables and
// writing one, the written value a strong hash of what it read and its index,
// so any reordering of conflicting ops changes the final values. A plain loop
// is the oracle; naive and threaded engines (1, 2, 4, 8 workers; 1 and 3 CPU
// devices; random priorities; some async ops) must agree with it exactly, and
// every variable's version must equal the number of ops that wrote it.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <latch>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"
#include "engine/random_workload.h"
#include "weft/engine.h"

using namespace weft_test;

namespace {
std::vector<Config> differential_configs() {
  std::vector<Config> out;
  out.push_back(Config{"naive", 1, 1, 0});
  for (int devices : {1, 3})
    for (int w : worker_counts()) out.push_back(Config{"threaded", w, devices, 0});
  return out;
}

}  // namespace


TEST_CASE("differential: random workloads from one thread match the serial oracle" * doctest::timeout(300)) {
  const std::vector<std::uint64_t> seeds = kSanitized ? std::vector<std::uint64_t>{1}
                                                      : std::vector<std::uint64_t>{1, 2, 3};
  for (std::uint64_t seed : seeds) {
    CAPTURE(seed);
    const std::vector<OpSpec> ops = make_ops(seed, kOps, 0, range(0, kVars), range(0, kVars));
    std::vector<std::uint64_t> expected = initial_values(seed);
    std::vector<std::uint64_t> expected_writes(kVars, 0);
    run_serial(ops, expected, expected_writes);

    for (const Config& cfg : differential_configs()) {
      INFO("engine config: " << cfg.str());
      std::vector<std::uint64_t> values = initial_values(seed);
      std::vector<std::uint64_t> versions(kVars, 0);
      {
        auto e = make_engine(cfg);
        const std::vector<Var> vars = new_vars(*e);
        push_ops(*e, cfg, ops, vars, values.data());
        // Half the variables read back one by one, then everything.
        for (int i = 0; i < kVars; i += 2) e->wait_to_read(vars[static_cast<std::size_t>(i)]);
        e->wait_all();
        CHECK(e->inflight() == 0);
        versions = versions_of(*e, vars);
      }
      check_against_oracle(values, expected, versions, expected_writes);
    }
  }
}

TEST_CASE("differential: four pushing threads with disjoint writes match the serial oracle" * doctest::timeout(300)) {
  constexpr int kThreads = 4;
  constexpr int kOwned = 20;                    // vars [t*20, t*20+20) belong to thread t
  constexpr int kShared = kVars - kThreads * kOwned;  // vars [80, 100): read-only, initialised by ops
  constexpr int kOpsPerThread = kOps / kThreads;
  const std::vector<std::uint64_t> seeds = kSanitized ? std::vector<std::uint64_t>{7}
                                                      : std::vector<std::uint64_t>{7, 8};
  std::vector<Config> configs = all_configs();
  configs.push_back(Config{"threaded", 2, 3, 0});
  configs.push_back(Config{"threaded", 4, 1, 64});  // pushing threads block on a small bound

  for (std::uint64_t seed : seeds) {
    CAPTURE(seed);
    const std::vector<int> shared = range(kThreads * kOwned, kShared);
    std::vector<std::vector<OpSpec>> per_thread;
    for (int t = 0; t < kThreads; ++t) {
      std::vector<int> readable = range(t * kOwned, kOwned);
      readable.insert(readable.end(), shared.begin(), shared.end());
      per_thread.push_back(make_ops(seed * 31 + static_cast<std::uint64_t>(t), kOpsPerThread,
                                    static_cast<std::uint32_t>(t * kOpsPerThread), range(t * kOwned, kOwned),
                                    readable));
    }
    auto shared_value = [&](int i) { return mix64(seed ^ (0xABCDull << 20) ^ static_cast<std::uint64_t>(i)); };
    // Oracle: the shared vars get their values, then each thread's ops run in
    // order (threads write disjoint vars, so their interleaving is irrelevant).
    std::vector<std::uint64_t> expected = initial_values(seed);
    std::vector<std::uint64_t> expected_writes(kVars, 0);
    for (int i : shared) {
      expected[static_cast<std::size_t>(i)] = shared_value(i);
      expected_writes[static_cast<std::size_t>(i)] = 1;
    }
    for (int t = 0; t < kThreads; ++t) run_serial(per_thread[static_cast<std::size_t>(t)], expected, expected_writes);

    for (const Config& cfg : configs) {
      INFO("engine config: " << cfg.str());
      std::vector<std::uint64_t> values = initial_values(seed);
      std::vector<std::uint64_t> versions(kVars, 0);
      std::atomic<int> pushed_threads{0};
      {
        auto e = make_engine(cfg);
        const std::vector<Var> vars = new_vars(*e);
        std::uint64_t* data = values.data();
        for (int i : shared) {
          e->push([data, i, v = shared_value(i)](RunContext&) { data[i] = v; }, Device::cpu(0), {},
                  vars[static_cast<std::size_t>(i)]);
        }
        std::latch start(kThreads);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
          threads.emplace_back([&, t] {
            start.arrive_and_wait();
            push_ops(*e, cfg, per_thread[static_cast<std::size_t>(t)], vars, data);
            // Each thread also reads back one of its own variables.
            e->wait_to_read(vars[static_cast<std::size_t>(t * kOwned)]);
            pushed_threads.fetch_add(1);
          });
        }
        for (auto& th : threads) th.join();
        e->wait_all();
        versions = versions_of(*e, vars);
      }
      CHECK(pushed_threads.load() == kThreads);
      check_against_oracle(values, expected, versions, expected_writes);
    }
  }
}

namespace {

// An op of the failing workload: throws (or completes with an error) instead
// of writing when `fails` is set.
struct FailingOp {
  OpSpec spec;
  bool fails;
};

struct OpFailure : std::runtime_error {
  std::uint32_t index;
  explicit OpFailure(std::uint32_t i) : std::runtime_error("op " + std::to_string(i) + " failed"), index(i) {}
};

std::vector<FailingOp> make_failing_ops(std::uint64_t seed, int n) {
  SplitMix rng(seed ^ 0xFA11);
  std::vector<FailingOp> ops;
  const std::vector<OpSpec> specs = make_ops(seed, n, 0, range(0, kVars), range(0, kVars));
  for (const OpSpec& s : specs) {
    // More failures near the end, so that some are still there at the end.
    const bool late = s.index + 1000 >= static_cast<std::uint32_t>(n);
    FailingOp op{s, rng.below(late ? 25 : 150) == 0};
    // Few reads, many write-only ops: failures spread, and get cleared.
    op.spec.nreads = static_cast<std::uint8_t>(rng.below(3) == 0 ? 0 : std::min<int>(op.spec.nreads, 2));
    ops.push_back(op);
  }
  return ops;
}

}  // namespace

// The error rules, differentially: ops that read a failed variable are
// skipped (their writes keep the failure), a failing op leaves its output's
// value alone, a successful write clears the failure. The serial oracle knows
// which variables end up failed and every value; the naive engine and the
// threaded engines must also agree on which failure each wait reports.
TEST_CASE("differential: random workloads with failing ops agree on values, versions and errors" *
          doctest::timeout(300)) {
  constexpr int kFailOps = 30'000;
  const std::vector<std::uint64_t> seeds = kSanitized ? std::vector<std::uint64_t>{11}
                                                      : std::vector<std::uint64_t>{11, 12};
  for (std::uint64_t seed : seeds) {
    CAPTURE(seed);
    const std::vector<FailingOp> ops = make_failing_ops(seed, kFailOps);
    // Oracle.
    std::vector<std::uint64_t> expected = initial_values(seed);
    std::vector<std::uint64_t> expected_writes(kVars, 0);
    std::vector<bool> failed(kVars, false);
    int skipped = 0, failures = 0;
    for (const FailingOp& op : ops) {
      bool reads_failed = false;
      for (int r = 0; r < op.spec.nreads; ++r) reads_failed |= failed[op.spec.reads[r]];
      ++expected_writes[op.spec.write];
      if (reads_failed) {
        failed[op.spec.write] = true;
        ++skipped;
      } else if (op.fails) {
        failed[op.spec.write] = true;
        ++failures;
      } else {
        apply(op.spec, expected.data());
        failed[op.spec.write] = false;
      }
    }
    const int failed_vars = static_cast<int>(std::count(failed.begin(), failed.end(), true));
    INFO("oracle: " << failures << " failing ops, " << skipped << " skipped, " << failed_vars << " vars failed");
    REQUIRE(failures > 0);
    REQUIRE(failed_vars > 0);
    REQUIRE(failed_vars < kVars);

    std::vector<long> reference_outcomes;  // the naive engine's, per var: -1 no throw, else failing op index
    for (const Config& cfg : differential_configs()) {
      INFO("engine config: " << cfg.str());
      std::vector<std::uint64_t> values = initial_values(seed);
      std::vector<std::uint64_t> versions(kVars, 0);
      std::vector<long> outcomes(kVars, -2);
      {
        auto e = make_engine(cfg);
        const std::vector<Var> vars = new_vars(*e);
        std::uint64_t* data = values.data();
        for (const FailingOp& op : ops) {
          std::array<Var, kMaxReads> reads;
          const std::size_t n = std::min<std::size_t>(op.spec.nreads, kMaxReads);
          for (std::size_t r = 0; r < n; ++r) reads[r] = vars[op.spec.reads[r]];
          const Device device = Device::cpu(op.spec.device % cfg.cpu_devices);
          const std::span<const Var> read_list(reads.data(), n);
          const weft::OpOptions options{.priority = op.spec.priority};
          if (op.spec.async) {
            e->push_async(
                [o = &op, data](RunContext&, Completion done) {
                  if (o->fails) {
                    done(std::make_exception_ptr(OpFailure(o->spec.index)));
                    return;
                  }
                  apply(o->spec, data);
                  done();
                },
                device, read_list, vars[op.spec.write], options);
          } else {
            e->push(
                [o = &op, data](RunContext&) {
                  if (o->fails) throw OpFailure(o->spec.index);
                  apply(o->spec, data);
                },
                device, read_list, vars[op.spec.write], options);
          }
        }
        // Drain without reporting anything: a wait would mark a failure
        // reported while ops reading it are still queued, and those would
        // then run instead of being skipped (timing-dependent by design).
        REQUIRE(eventually([&] { return e->inflight() == 0; }, 120s));
        for (int i = 0; i < kVars; ++i) {
          try {
            e->wait_to_read(vars[static_cast<std::size_t>(i)]);
            outcomes[static_cast<std::size_t>(i)] = -1;
          } catch (const OpFailure& f) {
            outcomes[static_cast<std::size_t>(i)] = f.index;
          } catch (...) {
            outcomes[static_cast<std::size_t>(i)] = -3;  // wrong type
          }
        }
        try {
          e->wait_all();  // failures not carried by any variable any more
        } catch (const OpFailure&) {
        }
        CHECK_NOTHROW(e->wait_all());
        versions = versions_of(*e, vars);
      }
      int value_mismatches = 0, version_mismatches = 0, clean_but_threw = 0, wrong_type = 0;
      for (int i = 0; i < kVars; ++i) {
        const auto u = static_cast<std::size_t>(i);
        value_mismatches += values[u] != expected[u];
        version_mismatches += versions[u] != expected_writes[u];
        clean_but_threw += !failed[u] && outcomes[u] != -1;
        wrong_type += outcomes[u] == -3;
      }
      CHECK(value_mismatches == 0);
      CHECK(version_mismatches == 0);
      CHECK(clean_but_threw == 0);
      CHECK(wrong_type == 0);
      // The first failed variable's wait reports a failure.
      const auto first_failed = static_cast<std::size_t>(std::find(failed.begin(), failed.end(), true) - failed.begin());
      CHECK(outcomes[first_failed] >= 0);
      if (reference_outcomes.empty()) {
        reference_outcomes = outcomes;  // the naive engine
      } else {
        int differing = 0;
        for (int i = 0; i < kVars; ++i) differing += outcomes[static_cast<std::size_t>(i)] != reference_outcomes[static_cast<std::size_t>(i)];
        CHECK(differing == 0);
      }
    }
  }
}
