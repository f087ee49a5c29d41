// The per-device algorithm cache of GPU convolutions (ops/src/gpu/
// algorithm_cache.h) on its own, without cuDNN: least-recently-used eviction
// and the size bound, one choice per key across concurrent callers (the
// others wait and take it), choices made while capturing are provisional and
// never measured, a later uncaptured call measures them, failed choices, and
// WEFT_CUDNN_CACHE_SIZE's refusals.
#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <latch>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_test_util.h"
#include "gpu/algorithm_cache.h"
#include "weft/error.h"

using weft::kernels::gpu::AlgorithmCache;
using weft::kernels::gpu::algorithm_cache_size_from_env;

namespace {

using AlgoKey = std::array<std::int64_t, 3>;  // as the convolution's: geometry fields, dtype, direction...
using AlgoCache = AlgorithmCache<AlgoKey, int>;

AlgoKey algo_key(std::int64_t i) { return AlgoKey{i, 2 * i + 1, i % 3}; }

// A choice that must not happen.
int algo_never() {
  FAIL("a choice was made where the cache holds one");
  return -1;
}

// Waits (yielding, bounded) until `done` holds; false on time out.
template <class Done>
bool algo_wait_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

TEST_CASE("algorithm cache - least recently used entries leave first and the size stays bounded" *
          doctest::timeout(30)) {
  AlgoCache cache(3);
  CHECK(cache.capacity() == 3);
  for (std::int64_t i = 0; i < 3; ++i) CHECK(cache.get(algo_key(i), false, [&] { return int(10 + i); }, algo_never) == 10 + i);
  CHECK(cache.size() == 3);
  CHECK(cache.keys() == std::vector<AlgoKey>{algo_key(2), algo_key(1), algo_key(0)});
  // A hit makes key 0 the most recent; key 1 is now the least recent.
  CHECK(cache.get(algo_key(0), false, algo_never, algo_never) == 10);
  CHECK(cache.keys() == std::vector<AlgoKey>{algo_key(0), algo_key(2), algo_key(1)});
  CHECK(cache.get(algo_key(3), false, [] { return 13; }, algo_never) == 13);
  CHECK(cache.size() == 3);
  CHECK_FALSE(cache.peek(algo_key(1)));
  CHECK(cache.keys() == std::vector<AlgoKey>{algo_key(3), algo_key(0), algo_key(2)});
  CHECK(cache.stats().evictions == 1);
  // peek does not touch: key 2 stays the least recent and leaves next.
  CHECK(cache.peek(algo_key(2)) == 12);
  CHECK(cache.get(algo_key(4), false, [] { return 14; }, algo_never) == 14);
  CHECK_FALSE(cache.peek(algo_key(2)));
  // An evicted key is chosen again when it comes back (one more measurement).
  int measured = 0;
  CHECK(cache.get(algo_key(1), false, [&] { return ++measured, 21; }, algo_never) == 21);
  CHECK(measured == 1);
  CHECK(cache.stats().measured == 6);
  CHECK(cache.stats().evictions == 3);

  // Many keys through a small cache: never more than its capacity.
  AlgoCache small(16);
  std::mt19937_64 rng(5);
  for (int n = 0; n < 2000; ++n) {
    const std::int64_t k = static_cast<std::int64_t>(rng() % 40);
    CHECK(small.get(algo_key(k), false, [&] { return int(k); }, algo_never) == k);
    REQUIRE(small.size() <= 16);
  }
  CHECK(small.size() == 16);
}

TEST_CASE("algorithm cache - concurrent callers: one measurement per key, the others wait and get the same choice" *
          doctest::timeout(60)) {
  constexpr int kThreads = 8, kKeys = 12, kRounds = 50;
  AlgoCache cache(64);
  std::array<std::atomic<int>, kKeys> calls{};
  std::atomic<int> next_plan{100};
  std::vector<std::vector<int>> seen(kThreads, std::vector<int>(kKeys, -1));
  std::atomic<bool> mismatch{false}, waited{true};
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int r = 0; r < kRounds; ++r) {
        for (int j = 0; j < kKeys; ++j) {
          const int k = (j + t * 5) % kKeys;  // each thread walks the keys from another start
          const int plan = cache.get(
              algo_key(k), false,
              [&] {
                calls[static_cast<std::size_t>(k)].fetch_add(1);
                // Key 0's measurement lasts until every other thread waits on
                // it: they must wait rather than measure it themselves.
                if (k == 0 && !algo_wait_until([&] { return cache.stats().waits >= kThreads - 1; }))
                  waited = false;
                return next_plan.fetch_add(1);  // a second measurement would give another plan
              },
              algo_never);
          int& mine = seen[static_cast<std::size_t>(t)][static_cast<std::size_t>(k)];
          if (mine != -1 && mine != plan) mismatch = true;
          mine = plan;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(waited);
  CHECK_FALSE(mismatch);
  for (int k = 0; k < kKeys; ++k) {
    INFO("key " << k);
    CHECK(calls[static_cast<std::size_t>(k)].load() == 1);
    for (int t = 1; t < kThreads; ++t)
      CHECK(seen[static_cast<std::size_t>(t)][static_cast<std::size_t>(k)] == seen[0][static_cast<std::size_t>(k)]);
  }
  const AlgoCache::Stats s = cache.stats();
  CHECK(s.measured == kKeys);
  CHECK(s.estimated == 0);
  CHECK(s.hits + s.measured == std::uint64_t{kThreads} * kRounds * kKeys);
}

TEST_CASE("algorithm cache - a key first seen while capturing is provisional, never measured there, and measured "
          "at its next uncaptured use" *
          doctest::timeout(30)) {
  AlgoCache cache(8);
  int estimates = 0, measures = 0;
  const auto measure = [&] { return ++measures, 2; };
  const auto estimate = [&] { return ++estimates, 1; };
  // A captured step's first use: the heuristic's choice, kept provisional.
  CHECK(cache.get(algo_key(0), true, algo_never, estimate) == 1);
  CHECK(cache.provisional(algo_key(0)));
  // Still capturing: the provisional choice serves, nothing is chosen again.
  CHECK(cache.get(algo_key(0), true, algo_never, algo_never) == 1);
  CHECK(estimates == 1);
  // Outside capture: measured now, final from then on.
  CHECK(cache.get(algo_key(0), false, measure, algo_never) == 2);
  CHECK_FALSE(cache.provisional(algo_key(0)));
  CHECK(cache.get(algo_key(0), true, algo_never, algo_never) == 2);
  CHECK(cache.get(algo_key(0), false, algo_never, algo_never) == 2);
  CHECK(measures == 1);
  // A key measured before capture (a replay's uncaptured warm-up) is a hit in
  // the capture: no heuristic choice, no trial run.
  CHECK(cache.get(algo_key(1), false, measure, algo_never) == 2);
  CHECK(cache.get(algo_key(1), true, algo_never, algo_never) == 2);
  CHECK(measures == 2);
  const AlgoCache::Stats s = cache.stats();
  CHECK(s.estimated == 1);
  CHECK(s.measured == 2);

  // While another worker measures a provisional key, a capturing caller takes
  // the provisional choice at once (it does not wait on a trial run).
  CHECK(cache.get(algo_key(2), true, algo_never, [] { return 30; }) == 30);
  std::atomic<bool> measuring{false}, captured{false};
  std::thread worker([&] {
    CHECK(cache.get(algo_key(2), false,
                    [&] {
                      measuring = true;
                      CHECK(algo_wait_until([&] { return captured.load(); }));
                      return 31;
                    },
                    algo_never) == 31);
  });
  CHECK(algo_wait_until([&] { return measuring.load(); }));
  CHECK(cache.get(algo_key(2), true, algo_never, algo_never) == 30);
  captured = true;
  worker.join();
  CHECK(cache.get(algo_key(2), true, algo_never, algo_never) == 31);
  CHECK_FALSE(cache.provisional(algo_key(2)));
}

TEST_CASE("algorithm cache - under concurrent captured and uncaptured callers no measurement runs while capturing" *
          doctest::timeout(60)) {
  constexpr int kThreads = 6, kKeys = 10, kRounds = 200;
  AlgoCache cache(32);
  thread_local bool in_capture = false;
  std::atomic<int> measured_in_capture{0}, measures{0}, estimates{0};
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) + 1);
      start.arrive_and_wait();
      for (int r = 0; r < kRounds; ++r) {
        const int k = static_cast<int>(rng() % kKeys);
        in_capture = t < 2 || rng() % 3 == 0;  // two threads always capture
        const int plan = cache.get(
            algo_key(k), in_capture,
            [&] {
              if (in_capture) measured_in_capture.fetch_add(1);
              measures.fetch_add(1);
              return 1000 + k;
            },
            [&] {
              estimates.fetch_add(1);
              return k;
            });
        CHECK((plan == k || plan == 1000 + k));
        if (!in_capture) CHECK(plan == 1000 + k);  // outside capture only measured choices
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(measured_in_capture.load() == 0);
  CHECK(measures.load() <= kKeys);                   // once per key at most
  CHECK(estimates.load() <= kKeys);                  // a provisional entry is made once
  CHECK(cache.stats().measured == static_cast<std::uint64_t>(measures.load()));
  for (int k = 0; k < kKeys; ++k) {
    if (!cache.peek(algo_key(k))) continue;
    if (!cache.provisional(algo_key(k))) CHECK(cache.peek(algo_key(k)) == 1000 + k);
  }
}

TEST_CASE("algorithm cache - a choice that throws leaves the key unchosen, or provisional, and others retry" *
          doctest::timeout(30)) {
  AlgoCache cache(4);
  const auto fail = []() -> int { throw std::runtime_error("trial run failed"); };
  CHECK_THROWS_WITH_AS(cache.get(algo_key(0), false, fail, algo_never), "trial run failed", std::runtime_error);
  CHECK(cache.size() == 0);
  CHECK(cache.get(algo_key(0), false, [] { return 5; }, algo_never) == 5);
  // A provisional entry whose measurement fails stays provisional.
  CHECK(cache.get(algo_key(1), true, algo_never, [] { return 3; }) == 3);
  CHECK_THROWS_AS(cache.get(algo_key(1), false, fail, algo_never), std::runtime_error);
  CHECK(cache.provisional(algo_key(1)));
  CHECK(cache.get(algo_key(1), true, algo_never, algo_never) == 3);
  CHECK(cache.get(algo_key(1), false, [] { return 4; }, algo_never) == 4);
  CHECK_FALSE(cache.provisional(algo_key(1)));

  // A waiter whose chooser throws chooses itself.
  AlgoCache shared(4);
  std::atomic<int> second_measures{0};
  std::thread first([&] {
    CHECK_THROWS_AS(shared.get(algo_key(7), false,
                               [&]() -> int {
                                 CHECK(algo_wait_until([&] { return shared.stats().waits >= 1; }));
                                 throw std::runtime_error("first chooser fails");
                               },
                               algo_never),
                    std::runtime_error);
  });
  std::thread second([&] {
    CHECK(algo_wait_until([&] { return shared.size() == 1; }));  // the first holds the key
    CHECK(shared.get(algo_key(7), false, [&] { return second_measures.fetch_add(1), 70; }, algo_never) == 70);
  });
  first.join();
  second.join();
  CHECK(second_measures.load() == 1);
  CHECK(shared.peek(algo_key(7)) == 70);
}

TEST_CASE("algorithm cache - WEFT_CUDNN_CACHE_SIZE: default 1024, a size of 0 or text refused naming it" *
          doctest::timeout(30)) {
  {
    weft_test::EnvGuard env("WEFT_CUDNN_CACHE_SIZE", nullptr);
    CHECK(algorithm_cache_size_from_env() == 1024);
  }
  {
    weft_test::EnvGuard env("WEFT_CUDNN_CACHE_SIZE", "16");
    CHECK(algorithm_cache_size_from_env() == 16);
  }
  for (const char* bad : {"0", "-4", "lots", "12x", "2000000"}) {
    INFO("WEFT_CUDNN_CACHE_SIZE=" << bad);
    weft_test::EnvGuard env("WEFT_CUDNN_CACHE_SIZE", bad);
    CHECK_THROWS_WITH_AS(algorithm_cache_size_from_env(),
                         doctest::Contains((std::string("WEFT_CUDNN_CACHE_SIZE='") + bad + "'").c_str()),
                         weft::InvalidArgument);
  }
  CHECK_THROWS_WITH_AS(AlgoCache(0), doctest::Contains("WEFT_CUDNN_CACHE_SIZE"), weft::InvalidArgument);
}

TEST_CASE("algorithm cache - the try order of a ranking: failed algorithms out, deterministic mode keeps only "
          "deterministic ones, strict float32 tries FMA-only first" *
          doctest::timeout(30)) {
  using weft::kernels::gpu::candidate_order;
  using weft::kernels::gpu::RankedAlgorithm;
  // As cuDNN ranks them: fastest first.
  const std::vector<RankedAlgorithm> ranking{
      {.algo = 6, .ok = true, .deterministic = false, .fma_only = false},  // e.g. a tensor-op Winograd
      {.algo = 1, .ok = true, .deterministic = true, .fma_only = false},
      {.algo = 5, .ok = false, .deterministic = true, .fma_only = true},  // failed its trial run
      {.algo = 0, .ok = true, .deterministic = false, .fma_only = true},
      {.algo = 2, .ok = true, .deterministic = true, .fma_only = true},
  };
  using Order = std::vector<std::size_t>;
  CHECK(candidate_order(ranking, false, false) == Order{0, 1, 3, 4});
  CHECK(candidate_order(ranking, true, false) == Order{1, 4});
  CHECK(candidate_order(ranking, false, true) == Order{3, 4, 0, 1});
  CHECK(candidate_order(ranking, true, true) == Order{4, 1});
  // No deterministic algorithm: nothing to try (the convolution then names
  // the geometry in its error).
  const std::vector<RankedAlgorithm> none{{.algo = 0, .ok = true, .deterministic = false, .fma_only = true}};
  CHECK(candidate_order(none, true, true).empty());
  CHECK(candidate_order({}, false, false).empty());
}
