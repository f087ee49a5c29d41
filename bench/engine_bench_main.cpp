// weft-bench-engine: Weft against a plain loop and peer runtimes on the same
// dependency shapes, in one process. Every run's result is checked against
// the sequential loop's, so the bench is also a correctness test (exit 1).
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <chrono>
#include <thread>
#include <vector>

#include <oneapi/tbb/info.h>

#include "calibrate.h"
#include "measure.h"
#include "options.h"
#include "peer.h"
#include "report.h"

namespace weft_bench {
namespace {

// Sizes are nominal / divisor: --quick divides by 16 and the 10us body by a
// further 8, so one full-size 10us run stays around a second per peer.
constexpr std::size_t kQuickDivisor = 16;
constexpr int kTenUsDivisor = 8;

struct Plan {
  std::vector<ShapeKind> shapes;
  std::vector<Body> bodies;
  std::size_t quick_divisor = 1;
  ShapeSpec spec(ShapeKind k, const Body& b) const {
    return make_shape(k, quick_divisor * static_cast<std::size_t>(b.ops_divisor));
  }
};

std::vector<std::unique_ptr<Peer>> make_peers(const Options& o, int threads) {
  auto wanted = [&](const std::string& name) {
    return name == "sequential" || o.engines.empty() ||
           std::find(o.engines.begin(), o.engines.end(), name) != o.engines.end();
  };
  std::vector<std::unique_ptr<Peer>> peers;
  peers.push_back(make_sequential_peer());  // always first: the reference
#ifndef WEFT_BENCH_NO_WEFT
  if (wanted("weft")) peers.push_back(make_weft_peer());
  if (wanted("replay")) peers.push_back(make_weft_replay_peer());
  if (wanted("bulk")) peers.push_back(make_weft_bulk_peer());
  // The halves of "weft" timed apart: only when asked for.
  auto asked = [&](const std::string& name) {
    return std::find(o.engines.begin(), o.engines.end(), name) != o.engines.end();
  };
  if (asked("push_alone")) peers.push_back(make_weft_push_alone_peer());
  if (asked("drain_alone")) peers.push_back(make_weft_drain_alone_peer());
#endif
  if (wanted("tbb_flow_graph")) peers.push_back(make_tbb_flow_graph_peer(threads));
#ifdef WEFT_BENCH_HAVE_OMP
  if (wanted("omp_depend")) peers.push_back(make_omp_depend_peer(threads));
#endif
#ifdef WEFT_BENCH_HAVE_STARPU
  if (wanted("starpu")) peers.push_back(make_starpu_peer(threads));
#endif
  return peers;
}

struct CheckFailed {
  std::string message;
};

// One run, outside the timing: reset the items, run, compare with the
// reference result (the sequential warm-up sets it).
double checked_run(Peer& p, const ShapeSpec& s, const Body& b, std::uint64_t* items, std::uint64_t& reference,
                   bool is_reference) {
  reset_items(items, s.items);
  // Let the previous peer's threads finish spinning and go to sleep (oneTBB,
  // libgomp and Weft all spin a while after their work ends), so that no run
  // shares the cores with the previous runtime's idle loop.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const double seconds = p.run(s, b, items);
  const std::uint64_t sum = checksum_items(items, s.items);
  if (is_reference) {
    reference = sum;
  } else if (sum != reference) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s gave a wrong result on %s/%s (%zu ops): checksum %016" PRIx64
                  ", sequential %016" PRIx64,
                  std::string(p.name()).c_str(), std::string(s.name()).c_str(), b.name.c_str(), s.ops, sum, reference);
    throw CheckFailed{buf};
  }
  return seconds;
}

// --noise: threads that spin at normal priority from creation to
// destruction, so that the cores are oversubscribed while every peer runs
// (and the sequential loop: it is preempted as much).
class NoiseThreads {
 public:
  explicit NoiseThreads(int n) {
    for (int i = 0; i < n; ++i)
      threads_.emplace_back([this] {
        // A counter of its own (volatile: kept): no line shared but the flag.
        volatile std::uint64_t spins = 0;
        while (!stop_.load(std::memory_order_relaxed)) spins = spins + 1;
      });
  }
  ~NoiseThreads() {
    stop_.store(true, std::memory_order_relaxed);
    for (auto& t : threads_) t.join();
  }
  NoiseThreads(const NoiseThreads&) = delete;
  NoiseThreads& operator=(const NoiseThreads&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

int run_bench(const Options& o) {
  // The CPUs this process may run on (oneTBB reads the affinity mask, so a
  // `taskset` run gives the peers as many threads as Weft's default workers).
  const int threads = std::max(1, tbb::info::default_concurrency());
  std::FILE* info = o.json_only ? stderr : stdout;  // keeps stdout pure JSON lines under --json

  Plan plan;
  plan.shapes = o.shapes.empty() ? std::vector<ShapeKind>(std::begin(kAllShapes), std::end(kAllShapes)) : o.shapes;
  plan.quick_divisor = o.smoke ? 256 : o.quick ? kQuickDivisor : 1;

  // One items array for the whole process: StarPU registers its addresses.
  std::size_t capacity = kCalibrationItems;
  for (ShapeKind k : plan.shapes)
    for (int div : {1, kTenUsDivisor}) capacity = std::max(capacity, make_shape(k, plan.quick_divisor * div).items);
  std::vector<std::uint64_t> items_storage(capacity);
  std::uint64_t* items = items_storage.data();

  std::vector<std::unique_ptr<Peer>> peers = make_peers(o, threads);

  const Calibration cal = calibrate(*peers.front(), items);
  for (const char* name : {"empty", "1us", "10us"}) {
    if (!o.bodies.empty() && std::find(o.bodies.begin(), o.bodies.end(), name) == o.bodies.end()) continue;
    const std::string n = name;
    plan.bodies.push_back(n == "empty" ? Body{n, 0, 1}
                          : n == "1us" ? Body{n, cal.spin_iters_per_us, 1}
                                       : Body{n, 10 * cal.spin_iters_per_us, kTenUsDivisor});
  }

  std::fprintf(info, "weft-bench-engine: %d CPUs to run on, %d timed reps + 1 warm-up per peer, %s sizes\n", threads,
               o.reps, o.smoke ? "--smoke (1/256)" : o.quick ? "--quick (1/16)" : "full");
  std::fprintf(info,
               "calibration: 1us = %" PRIu64 " spin iterations; sequential independent loop measures empty %.1f ns/op, "
               "1us %.1f ns/op, 10us %.1f ns/op; a cache line's round trip between two threads %.0f ns\n",
               cal.spin_iters_per_us, cal.empty_ns, cal.one_us_ns, cal.ten_us_ns, cal.core_round_trip_ns);
  for (const auto& p : peers) std::fprintf(info, "  %-15s %s\n", std::string(p->name()).c_str(), p->describe().c_str());
  if (o.noise_threads > 0)
    std::fprintf(info, "noise: %d threads spinning beside every measurement (%d CPUs to run on)\n", o.noise_threads,
                 threads);
  std::fflush(info);
  const NoiseThreads noise(o.noise_threads);

  std::vector<Result> results;
  std::vector<std::string> engine_names;
  for (const auto& p : peers) engine_names.emplace_back(p->name());

  for (ShapeKind k : plan.shapes) {
    for (const Body& body : plan.bodies) {
      const ShapeSpec spec = plan.spec(k, body);
      for (auto& p : peers) p->prepare(spec, items);
      std::uint64_t reference = 0;
      // Warm-up: first touches, pools and caches; also the first check.
      for (std::size_t i = 0; i < peers.size(); ++i) checked_run(*peers[i], spec, body, items, reference, i == 0);
      // Interleaved (A B C A B C ...) so drift in machine load hits every peer alike.
      std::vector<std::vector<double>> ns(peers.size());
      for (int r = 0; r < o.reps; ++r)
        for (std::size_t i = 0; i < peers.size(); ++i)
          ns[i].push_back(checked_run(*peers[i], spec, body, items, reference, false) * 1e9 /
                          static_cast<double>(spec.ops));
      const double seq_median = summarize(ns[0]).median;
      for (std::size_t i = 0; i < peers.size(); ++i) {
        Result r;
        r.engine = engine_names[i];
        r.shape = std::string(spec.name());
        r.body = body.name;
        r.ops = spec.ops;
        r.reps = o.reps;
        r.core_round_trip_ns = cal.core_round_trip_ns;
        r.noise_threads = o.noise_threads;
        r.ns_per_op = summarize(ns[i]);
        r.speedup_vs_sequential = r.ns_per_op.median > 0 ? seq_median / r.ns_per_op.median : 0;
        print_json_line(stdout, r);
        results.push_back(std::move(r));
      }
    }
  }
  if (!o.json_only) print_table(stdout, results, engine_names);
  return 0;
}

}  // namespace
}  // namespace weft_bench

int main(int argc, char** argv) {
  const weft_bench::Options o = weft_bench::parse_options(argc, argv);
  try {
    return weft_bench::run_bench(o);
  } catch (const weft_bench::CheckFailed& f) {
    std::fprintf(stderr, "weft-bench-engine: CHECK FAILED: %s\n", f.message.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-bench-engine: error: %s\n", e.what());
    return 1;
  }
}
