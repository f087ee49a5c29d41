// weft-bench-allreduce: allreduce time, algbw and busbw per size, nccl-tests
// style (busbw = algbw * 2(n-1)/n), for Weft's in-process ring beside a
// single-thread memcpy of the same bytes, in one run. JSON lines with --json.
// (MPI peers — Weft over MPI and plain MPI_Allreduce — come with the MPI
// backend.)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "arg_cursor.h"
#include "measure.h"
#include "weft/engine.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

namespace {

struct Options {
  bool json = false;
  int members = 2;
  std::int64_t min_bytes = 4, max_bytes = std::int64_t{256} << 20;
  int reps = 5;
};

int usage(std::FILE* out, int rc) {
  std::fprintf(out,
               "usage: weft-bench-allreduce [--json] [--members N] [--min-bytes B] [--max-bytes B] [--reps N] [--quick]\n"
               "  Float sum allreduce over N in-process members (cpu(0)..cpu(N-1), one worker each), sizes\n"
               "  from --min-bytes to --max-bytes (default 4 B to 256 MiB, x4 steps); per size the median of\n"
               "  --reps timed runs (default 5), each enough calls to take ~50 ms. Peers in the same run: a\n"
               "  single-thread memcpy of the same bytes. --quick: up to 16 MiB, 3 reps.\n");
  return rc;
}

struct Row {
  std::string impl;
  int ranks;
  std::int64_t bytes;
  double time_us;
};

void print(const Row& r, bool json, double core_round_trip_ns) {
  const double algbw = r.time_us > 0 ? static_cast<double>(r.bytes) / (r.time_us * 1e3) : 0.0;
  const double busbw = r.impl == "memcpy" ? algbw : algbw * 2.0 * (r.ranks - 1) / std::max(1, r.ranks);
  if (json)
    std::printf(
        "{\"impl\":\"%s\",\"ranks\":%d,\"bytes\":%lld,\"time_us\":%.3f,\"algbw_gbs\":%.3f,\"busbw_gbs\":%.3f,"
        "\"core_round_trip_ns\":%.1f}\n",
        r.impl.c_str(), r.ranks, static_cast<long long>(r.bytes), r.time_us, algbw, busbw, core_round_trip_ns);
  else
    std::printf("%-10s %5d %12lld %12.3f %10.3f %10.3f\n", r.impl.c_str(), r.ranks, static_cast<long long>(r.bytes),
                r.time_us, algbw, busbw);
  std::fflush(stdout);
}

// Median over reps of the time per call, each rep running `calls` calls.
template <class F>
double time_per_call_us(int reps, F&& run_calls) {
  std::vector<double> per_call;
  run_calls(1);  // warm-up: caches, the allocator, first-touch of pages
  // Calibrate: enough calls for ~50 ms.
  weft_bench::Stopwatch probe;
  run_calls(1);
  const double one = std::max(probe.seconds(), 1e-7);
  const int calls = static_cast<int>(std::clamp(0.05 / one, 1.0, 100000.0));
  for (int r = 0; r < reps; ++r) {
    weft_bench::Stopwatch sw;
    run_calls(calls);
    per_call.push_back(sw.seconds() * 1e6 / calls);
  }
  return weft_bench::summarize(per_call).median;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (weft::examples::ArgCursor args(argc, argv); args.next();) {
    const std::string& a = args.flag();
    auto number = [&](long long lo, long long hi) -> std::optional<long long> {
      const std::optional<std::string> v = args.value();
      return v ? weft::examples::ArgCursor::parse_int(*v, lo, hi) : std::nullopt;
    };
    std::optional<long long> n;
    if (a == "--help" || a == "-h") return usage(stdout, 0);
    if (a == "--json") o.json = true;
    else if (a == "--quick") o.max_bytes = std::int64_t{16} << 20, o.reps = 3;
    else if (a == "--members" && (n = number(1, 64))) o.members = static_cast<int>(*n);
    else if (a == "--min-bytes" && (n = number(4, std::int64_t{1} << 34))) o.min_bytes = *n;
    else if (a == "--max-bytes" && (n = number(4, std::int64_t{1} << 34))) o.max_bytes = *n;
    else if (a == "--reps" && (n = number(1, 1000))) o.reps = static_cast<int>(*n);
    else {
      std::fprintf(stderr, "weft-bench-allreduce: bad argument '%s' (a flag needs a number in range)\n", a.c_str());
      return usage(stderr, 2);
    }
  }
  const double rtt = weft_bench::core_round_trip_ns();
  auto engine = weft::Engine::create({.kind = "threaded", .cpu_devices = o.members, .workers_per_cpu_device = 1});
  std::vector<weft::Device> devices;
  for (int r = 0; r < o.members; ++r) devices.push_back(weft::Device::cpu(r));
  const weft::parallel::Communicator comm = weft::parallel::Communicator::local(*engine, devices);
  std::fprintf(o.json ? stderr : stdout,
               "weft-bench-allreduce: %s, %u hardware threads, core round trip %.1f ns\n", comm.str().c_str(),
               std::thread::hardware_concurrency(), rtt);
  if (!o.json) std::printf("%-10s %5s %12s %12s %10s %10s\n", "impl", "ranks", "bytes", "time_us", "algbw_GB/s", "busbw_GB/s");

  for (std::int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    const std::int64_t count = bytes / 4;
    std::vector<weft::Tensor> t;
    for (int r = 0; r < o.members; ++r) t.push_back(weft::Tensor::full(*engine, weft::Shape{count}, 1.0f, devices[r]));
    engine->wait_all();
    const double ring_us = time_per_call_us(o.reps, [&](int calls) {
      for (int c = 0; c < calls; ++c) weft::parallel::allreduce(comm, t);
      engine->wait_all();
    });
    print({"weft_ring", o.members, bytes, ring_us}, o.json, rtt);

    std::vector<char> src(static_cast<std::size_t>(bytes), 1), dst(static_cast<std::size_t>(bytes));
    const double memcpy_us = time_per_call_us(o.reps, [&](int calls) {
      for (int c = 0; c < calls; ++c) {
        std::memcpy(dst.data(), src.data(), src.size());
        src[static_cast<std::size_t>(c) % src.size()] ^= 1;  // keep the copies from being merged
      }
    });
    print({"memcpy", 1, bytes, memcpy_us}, o.json, rtt);
  }
  return 0;
}
