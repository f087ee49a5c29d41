// Shared helpers for the engine tests: the configuration matrix every scenario
// runs over (naive, and threaded with 1, 2, 4, 8 workers), blockers that hold a
// worker until the test opens them, bounded polling (to detect a bug without
// hanging, never to make a test pass), live-instance counters and an
// environment-variable guard.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "test_workers.h"
#include "weft/engine.h"
#include "weft/error.h"

namespace weft_test {

using namespace std::chrono_literals;
using weft::Completion;
using weft::Device;
using weft::RunContext;
using weft::Var;

// Sanitized builds run the same scenarios, some with smaller loops.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
// ThreadSanitizer alone: cases whose size adds arithmetic rather than
// concurrency run a smaller cross product there (ASan and Release run all of it).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitized = true;
#else
inline constexpr bool kThreadSanitized = false;
#endif

struct Config {
  std::string kind = "threaded";
  int workers = 1;
  int cpu_devices = 1;
  std::size_t max_inflight = 0;  // 0: the engine's default

  bool threaded() const { return kind == "threaded"; }

  weft::EngineConfig engine_config() const {
    weft::EngineConfig c;
    c.kind = kind;
    c.cpu_devices = cpu_devices;
    c.workers_per_cpu_device = workers;
    c.max_inflight = max_inflight;
    return c;
  }

  std::string str() const {
    std::string s = kind;
    if (threaded()) s += " workers=" + std::to_string(workers);
    s += " cpu_devices=" + std::to_string(cpu_devices);
    if (max_inflight) s += " max_inflight=" + std::to_string(max_inflight);
    return s;
  }
};

inline const weft::Device cpu0 = weft::Device::cpu(0);

// {naive} ∪ {threaded × worker_counts()}: workers 1, 2, 4, 8 (test_workers.h).
inline std::vector<Config> all_configs(int cpu_devices = 1, std::size_t max_inflight = 0) {
  std::vector<Config> out;
  out.push_back(Config{"naive", 1, cpu_devices, max_inflight});
  for (int w : worker_counts()) out.push_back(Config{"threaded", w, cpu_devices, max_inflight});
  return out;
}

// Threaded configurations with at least `min_workers` workers.
inline std::vector<Config> threaded_configs(int min_workers = 1, int cpu_devices = 1, std::size_t max_inflight = 0) {
  std::vector<Config> out;
  for (int w : worker_counts_from(min_workers)) out.push_back(Config{"threaded", w, cpu_devices, max_inflight});
  return out;
}

template <class F>
void for_each_config(F&& fn, int cpu_devices = 1, std::size_t max_inflight = 0) {
  for (const Config& c : all_configs(cpu_devices, max_inflight)) {
    INFO("engine config: " << c.str());
    fn(c);
  }
}

template <class F>
void for_each_threaded(F&& fn, int min_workers = 1, int cpu_devices = 1, std::size_t max_inflight = 0) {
  for (const Config& c : threaded_configs(min_workers, cpu_devices, max_inflight)) {
    INFO("engine config: " << c.str());
    fn(c);
  }
}

inline std::unique_ptr<weft::Engine> make_engine(const Config& c) { return weft::Engine::create(c.engine_config()); }

// fn(engine) on a fresh engine of every configuration in all_configs,
// waiting for all its work after each.
template <class F>
void with_each_engine(int cpu_devices, F&& fn) {
  for (const Config& c : all_configs(cpu_devices)) {
    INFO("engine config: " << c.str());
    auto e = make_engine(c);
    fn(*e);
    e->wait_all();
  }
}

// Polls `pred` until it holds or `timeout` passes. Used to detect a missing
// event without hanging the binary; a passing test never depends on the time.
template <class Pred>
bool eventually(Pred&& pred, std::chrono::milliseconds timeout = 30s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::yield();
  }
  return true;
}

// True when `pred` holds throughout `window` (checked continuously). Gives a
// bug (something that must not happen yet) a chance to show; the test's
// verdict never depends on it passing quickly.
template <class Pred>
bool holds_for(Pred&& pred, std::chrono::milliseconds window) {
  auto deadline = std::chrono::steady_clock::now() + window;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!pred()) return false;
    std::this_thread::yield();
  }
  return pred();
}

// An op body that blocks its worker until the test opens the blocker. The blocker
// opens itself when destroyed, so a failing REQUIRE never leaves an engine
// draining forever: declare the Blocker after the engine.
class Blocker {
 public:
  Blocker() : state_(std::make_shared<State>()) {}
  ~Blocker() { open(); }
  Blocker(const Blocker&) = delete;
  Blocker& operator=(const Blocker&) = delete;

  // The op body: counts itself in, then blocks until open().
  auto body() const {
    return [s = state_](weft::RunContext&) { s->pass(); };
  }
  void open() {
    state_->opened.store(true);
    state_->opened.notify_all();
  }
  int entered() const { return state_->entered.load(); }
  bool wait_entered(int n = 1, std::chrono::milliseconds timeout = 30s) const {
    return eventually([&] { return entered() >= n; }, timeout);
  }
  // For custom bodies: blocks the calling op like body() does.
  void pass() const { state_->pass(); }

 private:
  struct State {
    std::atomic<bool> opened{false};
    std::atomic<int> entered{0};
    void pass() {
      entered.fetch_add(1);
      opened.wait(false);
    }
  };
  std::shared_ptr<State> state_;
};

// Counts live instances of a move-only token: construction and copies count
// one each, moves transfer ownership, destruction of an owner uncounts.
struct LiveCounter {
  std::atomic<long> live{0};
  std::atomic<long> peak{0};
  std::atomic<long> created{0};
  void inc() {
    long n = live.fetch_add(1) + 1;
    created.fetch_add(1);
    long p = peak.load();
    while (n > p && !peak.compare_exchange_weak(p, n)) {
    }
  }
  void dec() { live.fetch_sub(1); }
};

class LiveToken {
 public:
  explicit LiveToken(LiveCounter& c) : c_(&c) { c_->inc(); }
  LiveToken(const LiveToken& o) : c_(o.c_) {
    if (c_) c_->inc();
  }
  LiveToken(LiveToken&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  LiveToken& operator=(const LiveToken&) = delete;
  LiveToken& operator=(LiveToken&&) = delete;
  ~LiveToken() {
    if (c_) c_->dec();
  }

 private:
  LiveCounter* c_;
};

inline void atomic_max(std::atomic<std::size_t>& m, std::size_t v) {
  std::size_t cur = m.load();
  while (v > cur && !m.compare_exchange_weak(cur, v)) {
  }
}

// What `f()` threw, when it threw an E: its what(); nullopt otherwise (also
// when it threw something else, which the caller's CHECK then reports).
template <class E, class F>
std::optional<std::string> thrown_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return std::string(e.what());
  } catch (...) {
    return std::nullopt;
  }
  return std::nullopt;
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// What fn() throws as an E, or "(no error)" (anything else escapes).
template <class E, class F>
std::string what_thrown(F&& fn) {
  try {
    fn();
  } catch (const E& err) {
    return err.what();
  }
  return "(no error)";
}
// What fn() throws as a weft::Error, or "(no error)".
std::string error_of(auto&& fn) { return what_thrown<weft::Error>(fn); }
inline bool contains(const std::optional<std::string>& text, const std::string& part) {
  return text && contains(*text, part);
}

// Sets (or unsets, with nullptr) an environment variable for a scope.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = std::string(old);
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~EnvGuard() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Strong 64-bit mixer (splitmix64 finaliser).
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A little work, so that overlapping ops really overlap in time. The empty
// asm keeps the loop when the caller discards the result.
inline std::uint64_t spin_work(int n) {
  std::uint64_t h = 1;
  for (int i = 0; i < n; ++i) {
    h = mix64(h + static_cast<std::uint64_t>(i));
    asm volatile("" : "+r"(h));
  }
  return h;
}

// Tiny deterministic PRNG for workload generation.
struct SplitMix {
  std::uint64_t state;
  explicit SplitMix(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint32_t below(std::uint32_t n) { return static_cast<std::uint32_t>(next() % n); }
};

}  // namespace weft_test
