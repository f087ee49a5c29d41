// weft-bench-allreduce: allreduce time, algbw and busbw per size, nccl-tests
// style (busbw = algbw * 2(n-1)/n), in one run: Weft's in-process ring and a
// single-thread memcpy of the same bytes and, under mpirun, Weft over MPI
// (fingerprints on, and off) beside plain MPI_Allreduce on host buffers of
// the same size (Weft's rows on Weft tensors: a tensor's memory is not
// reachable from the public headers).
// JSON lines with --json; rank 0 prints.
#include <mpi.h>
#if WEFT_BENCH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <chrono>
#include <thread>
#include <vector>

#include "arg_cursor.h"
#include "measure.h"
#include "mpi_call_times.h"
#include "weft/engine.h"
#include "weft/gpu.h"
#include "weft/parallel/collectives.h"
#include "weft/parallel/flight_recorder.h"
#include "weft/tensor.h"
#include "weft/tensor_op.h"
// White-box: the NCCL path's check over MPI (--nccl-check).
#include "collectives/call.h"

namespace {

struct Options {
  bool json = false;
  int members = 2;
  std::int64_t min_bytes = 4, max_bytes = std::int64_t{256} << 20;
  int reps = 5;
  bool unchecked_first = false;  // create weft_mpi_unchecked's communicator before weft_mpi's
  bool per_rep = false;          // a JSON line per timed rep of the across-rank implementations
  bool flight_recorder = false;  // only the flight recorder's cost: on against off
  bool nccl_check = false;       // only the host-side check ahead of an NCCL launch: meeting against ahead
  bool max_bytes_given = false;
};

int usage(std::FILE* out, int rc) {
  std::fprintf(out,
               "usage: weft-bench-allreduce [--json] [--members N] [--min-bytes B] [--max-bytes B] [--reps N] [--quick]\n"
               "                            [--unchecked-first] [--per-rep] [--flight-recorder] [--nccl-check]\n"
               "       mpirun -np R weft-bench-allreduce [same flags]\n"
               "  Float sum allreduce, sizes from --min-bytes to --max-bytes (default 4 B to 256 MiB, x4 steps);\n"
               "  per size the median of --reps timed runs (default 5), each enough calls to take ~50 ms.\n"
               "  weft_ring: N in-process members (cpu(0)..cpu(N-1), one worker each; rank 0 only, the other\n"
               "  ranks sleep meanwhile); memcpy: a single-thread copy of the same bytes. Under mpirun, across\n"
               "  the R ranks: weft_mpi (Weft's MPI communicator, fingerprints on), weft_mpi_unchecked\n"
               "  (WEFT_COLLECTIVE_CHECK=0), both on one buffer, so each call waits for the one before through\n"
               "  the engine; weft_mpi_4_in_flight (four buffers in turn, as gradient buckets are, on a third\n"
               "  communicator); mpi (MPI_Allreduce in place) and mpi_4_buffers (the same over four buffers in\n"
               "  turn, the peer of 4_in_flight): these five with their reps interleaved so that slow spells\n"
               "  fall on all alike, each rep after one untimed call; each Weft row's vs_peer is the median\n"
               "  over reps of its rep's time over its peer's same rep (mpi; mpi_4_buffers for 4_in_flight).\n"
               "  --quick: up to 16 MiB, 3 reps. --unchecked-first: weft_mpi_unchecked's communicator is created\n"
               "  before weft_mpi's (at 16 MiB over two ranks the one created first has run slower).\n"
               "  --per-rep: also a JSON line per timed rep of those five (rank 0's): rep_of (the\n"
               "  implementation), rep, after (the one that ran just before), calls, time_us; within a rep\n"
               "  they run in a balanced order (each after every other equally often within reps, over any\n"
               "  multiple of 10 reps; 18 of the 20 pairs over 5).\n"
               "  Each of their timed batches is an MPI_Pcontrol window: under LD_PRELOAD of\n"
               "  libweft-mpi-call-times.so (scripts/bench-allreduce-mpi.sh --call-times) its MPI_Allreduce\n"
               "  calls are timed, and the time per call splits into inside MPI and outside.\n"
               "  Launch with --bind-to none: Weft's threads (engine workers, the communication thread)\n"
               "  need more than one core per rank.\n"
               "  Where GPUs answer (real, or simulated with WEFT_GPU_BACKEND=sim): weft_ring_gpu (or\n"
               "  weft_ring_sim_gpu), the in-process ring over min(N, GPUs) GPU members, and under mpirun\n"
               "  weft_mpi_gpu (or weft_mpi_sim_gpu), gpu(0) of every rank, staged through host memory.\n"
               "  Where Weft uses NCCL (real GPUs, WEFT_NCCL unset or 1) those rows are weft_nccl_gpu and\n"
               "  weft_nccl_mpi_gpu, beside nccl: ncclAllReduce called directly on the same GPUs (in-process).\n"
               "  Simulated GPUs run at CPU speed: their figures exercise the paths, they do not rate them.\n"
               "  --nccl-check: under mpirun, only the host-side path ahead of an NCCL collective's launch, on cpu(0):\n"
               "  its fingerprint check over MPI (call.h's check_across), then the launch's hold op (reading the\n"
               "  check's token and holding the 4-byte input, as NCCL's does). time_us: the median call's time from\n"
               "  its push (input ready) to that hold op's run, the median over reps of 200 calls each, one call at\n"
               "  a time. nccl_check_meeting: the token waits for every peer's status (the design before the check\n"
               "  ahead); nccl_check_ahead: it completes once the fingerprints matched and this rank's status went\n"
               "  out (the statuses settle before the next call); vs_peer over the meeting's, reps paired.\n"
               "  Rows _skew100us: every other rank's input is ready 100 us after rank 0's (its producer, pushed\n"
               "  just before the check, busy-waits 100 us), as ranks drift in a step; rank 0's times.\n"
               "  No GPU or NCCL needed: this is the code that runs before ncclAllReduce.\n"
               "  --flight-recorder: only the flight recorder's cost (weft/parallel/flight_recorder.h), sizes up\n"
               "  to 4 KiB unless --max-bytes says: weft_ring_recorder_on beside weft_ring_recorder_off (rank 0\n"
               "  alone) and, under mpirun, weft_mpi_recorder_on beside weft_mpi_recorder_off, the recorder\n"
               "  switched (2000 entries, or off) before each rep's untimed call, the reps of the two\n"
               "  interleaved; vs_peer is the median over reps of on over off in the same rep.\n");
  return rc;
}

struct Row {
  std::string impl;
  int ranks;
  std::int64_t bytes;
  double time_us;
  std::string peer = {};  // with vs_peer: the median of the paired reps' ratios to it
  double vs_peer = 0;
};

void print(const Row& r, bool json, double core_round_trip_ns) {
  const double algbw = r.time_us > 0 ? static_cast<double>(r.bytes) / (r.time_us * 1e3) : 0.0;
  const double busbw = r.impl == "memcpy" ? algbw : algbw * 2.0 * (r.ranks - 1) / std::max(1, r.ranks);
  if (json)
    std::printf(
        "{\"impl\":\"%s\",\"ranks\":%d,\"bytes\":%lld,\"time_us\":%.3f,\"algbw_gbs\":%.3f,\"busbw_gbs\":%.3f,"
        "%s\"core_round_trip_ns\":%.1f}\n",
        r.impl.c_str(), r.ranks, static_cast<long long>(r.bytes), r.time_us, algbw, busbw,
        r.peer.empty() ? "" : ("\"peer\":\"" + r.peer + "\",\"vs_peer\":" + std::to_string(r.vs_peer) + ",").c_str(),
        core_round_trip_ns);
  else
    std::printf("%-20s %5d %12lld %12.3f %10.3f %10.3f%s\n", r.impl.c_str(), r.ranks, static_cast<long long>(r.bytes),
                r.time_us, algbw, busbw,
                r.peer.empty() ? "" : ("  " + std::to_string(r.vs_peer).substr(0, 5) + "x " + r.peer).c_str());
  std::fflush(stdout);
}

// Calls per rep: enough for ~50 ms at the implementation's steady pace,
// timed over a batch that doubles until it takes 10 ms, after two warm-up
// calls. One timed call is not enough: the first calls at a new size, or
// after another implementation ran, are slower (16 MiB, two ranks over CMA
// on a 16-core machine: 8.8 ms, then down to 2.9 over five calls),
// and a single timed call once gave weft_mpi a third of the calls of
// weft_mpi_unchecked, whose reps those slow first calls then dominated: most
// of the 1.2-1.3x once put down to fingerprints at 16 MiB (docs/performance.md,
// "Design choices"). With
// `together`, every rank runs the same batches and rank 0's timing decides.
template <class F>
int calls_for_50ms(F&& run_calls, bool together) {
  run_calls(2);  // warm-up: caches, the allocator, first-touch of pages, a communicator's first use
  for (int batch = 1;; batch *= 2) {
    if (together) MPI_Barrier(MPI_COMM_WORLD);
    weft_bench::Stopwatch sw;
    run_calls(batch);
    double seconds = sw.seconds();
    if (together) MPI_Bcast(&seconds, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (seconds >= 0.01 || batch >= 100000)
      return static_cast<int>(std::clamp(0.05 * batch / std::max(seconds, 1e-9), 1.0, 100000.0));
  }
}

// Median over reps of the time per call, each rep running `calls` calls (one
// process alone).
template <class F>
double time_per_call_us_alone(int reps, F&& run_calls) {
  std::vector<double> per_call;
  const int calls = calls_for_50ms(run_calls, false);
  for (int r = 0; r < reps; ++r) {
    weft_bench::Stopwatch sw;
    run_calls(calls);
    per_call.push_back(sw.seconds() * 1e6 / calls);
  }
  return weft_bench::summarize(per_call).median;
}

// The MPI job: every rank runs every measurement; rank 0 prints.
struct Job {
  int rank = 0, size = 1;
  // Ranks other than 0 wait here, sleeping, while rank 0 measures alone
  // (MPI_Barrier would spin and take the cores the measurement needs).
  void rank0_alone(const std::function<void()>& measure) const {
    if (rank == 0) measure();
    MPI_Request request;
    MPI_Ibarrier(MPI_COMM_WORLD, &request);
    for (int done = 0;;) {
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (done) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
};

// The order of the implementations in rep `rep`: the rows of a Williams
// design (a balanced Latin square; for an odd count, its mirror too, each
// mirrored row right after its forward one, so that a run of fewer than 2n
// reps is nearly balanced as well), so that over n reps (2n for an odd n)
// each implementation runs first equally often and, within a rep, follows
// every other one equally often. (A mirrored row starts with the one its
// forward row ended with: across that boundary each implementation follows
// itself, once in 2n reps, all alike.) At 16 MiB
// the first calls after another implementation ran are slower (above), by
// how much depending on what that one left in the cache. Rotating one
// fixed order would keep each implementation's predecessor in all but one
// position: weft_mpi_unchecked would always run after weft_mpi, on the same
// tensor, and weft_mpi after mpi_4_buffers.
std::vector<std::size_t> rep_order(std::size_t n, int rep) {
  // 0, 1, n-1, 2, n-2, ...: for an even n every step between neighbours
  // (mod n) differs; for an odd n each step comes twice, and the mirrored
  // row has the opposite steps.
  std::vector<std::size_t> row(n);
  for (std::size_t k = 1; k < n; ++k) row[k] = k % 2 ? (k + 1) / 2 : n - k / 2;
  const auto r = static_cast<std::size_t>(rep);
  const bool odd = n % 2 == 1;
  const std::size_t shift = odd ? r / 2 : r;
  for (std::size_t& x : row) x = (x + shift) % n;
  if (odd && r % 2 == 1) std::reverse(row.begin(), row.end());
  return row;
}

// One timed rep of one implementation: which ran before it (`after`; the
// last one calibrated, for the first), and its calls.
struct Rep {
  int rep;
  std::size_t impl, after;
  int calls;
  double us_per_call;
};

// One implementation timed across the ranks: its name (the row's impl) and
// what runs `calls` of its calls.
struct Impl {
  const char* name;
  std::function<void(int)> run;
};

// The time per call of each implementation in each rep, each rep
// running the same number of calls on every rank, starting together: the
// most that any implementation's calls_for_50ms asked for (rank 0's
// timing). They all move the same bytes across the same ranks, so one count
// suits them all, and it keeps a calibration that fell on a slow spell from
// giving one implementation a few calls per rep, whose fixed costs and
// noise its reps then carry alone (a 2-core VM, two ranks, one run: 15 calls for
// weft_mpi at 1 MiB against 310-376 for the others; 2 against 9 at 16 MiB).
// The reps are interleaved (rep r of every implementation before rep r + 1
// of any), so a slow spell of this noisy machine falls on all of them alike
// instead of on whichever ran then: the ratios are what the targets are
// about. Within a rep they run in rep_order's order. Each rep begins with
// one untimed call, as nccl-tests' warm-up iterations do, and what is
// measured is the steady cost of back-to-back calls, as a training step's
// buckets make them. `on_rep` sees every timed rep. Each timed batch is a
// window of the MPI profiling interposer weft-mpi-call-times
// (mpi_call_times.cpp; MPI_Pcontrol does nothing without it).
std::vector<std::vector<double>> times_per_call_us_together(int reps, const std::vector<Impl>& impls,
                                                            const std::function<void(const Rep&)>& on_rep = {}) {
  int most = 1;
  for (const Impl& impl : impls) most = std::max(most, calls_for_50ms(impl.run, true));
  std::vector<std::vector<double>> per_call(impls.size());
  std::size_t after = impls.size() - 1;
  for (int r = 0; r < reps; ++r)
    for (std::size_t i : rep_order(impls.size(), r)) {
      MPI_Barrier(MPI_COMM_WORLD);
      impls[i].run(1);
      MPI_Barrier(MPI_COMM_WORLD);
      MPI_Pcontrol(weft_bench::kCallTimesOpen, impls[i].name);
      weft_bench::Stopwatch sw;
      impls[i].run(most);
      per_call[i].push_back(sw.seconds() * 1e6 / most);
      MPI_Pcontrol(weft_bench::kCallTimesClose);
      if (on_rep) on_rep({r, i, after, most, per_call[i].back()});
      after = i;
    }
  return per_call;
}

// The median over reps of a's time over b's in the same rep: the two ran
// back to back, so a slow spell that spans both cancels out, where the
// ratio of the medians keeps it whenever it fell on more of one's reps.
double paired_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> ratios;
  for (std::size_t r = 0; r < a.size() && r < b.size(); ++r) ratios.push_back(a[r] / b[r]);
  return weft_bench::summarize(ratios).median;
}

#if WEFT_BENCH_NCCL
// The peer of Weft's GPU members: ncclAllReduce called directly, one
// communicator per GPU of this process, each call waited for.
double direct_nccl_us(int gpus, std::int64_t count, int reps) {
  auto check = [](ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(rc));
  };
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(gpus));
  std::vector<int> ordinals;
  for (int g = 0; g < gpus; ++g) ordinals.push_back(g);
  check(ncclCommInitAll(comms.data(), gpus, ordinals.data()), "ncclCommInitAll");
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(gpus));
  std::vector<float*> buffers(static_cast<std::size_t>(gpus));
  for (int g = 0; g < gpus; ++g) {
    cudaSetDevice(g);
    cudaStreamCreate(&streams[static_cast<std::size_t>(g)]);
    cudaMalloc(&buffers[static_cast<std::size_t>(g)], static_cast<std::size_t>(count) * sizeof(float) + 4);
  }
  const double us = time_per_call_us_alone(reps, [&](int calls) {
    for (int c = 0; c < calls; ++c) {
      check(ncclGroupStart(), "ncclGroupStart");
      for (int g = 0; g < gpus; ++g)
        check(ncclAllReduce(buffers[static_cast<std::size_t>(g)], buffers[static_cast<std::size_t>(g)],
                            static_cast<std::size_t>(count), ncclFloat32, ncclSum, comms[static_cast<std::size_t>(g)],
                            streams[static_cast<std::size_t>(g)]),
              "ncclAllReduce");
      check(ncclGroupEnd(), "ncclGroupEnd");
      for (int g = 0; g < gpus; ++g) cudaStreamSynchronize(streams[static_cast<std::size_t>(g)]);
    }
  });
  for (int g = 0; g < gpus; ++g) {
    cudaSetDevice(g);
    cudaFree(buffers[static_cast<std::size_t>(g)]);
    cudaStreamDestroy(streams[static_cast<std::size_t>(g)]);
    ncclCommDestroy(comms[static_cast<std::size_t>(g)]);
  }
  return us;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (weft::examples::ArgCursor args(argc, argv); args.next();) {
    const std::string& a = args.flag();
    std::optional<long long> n;
    if (a == "--help" || a == "-h") return usage(stdout, 0);
    if (a == "--json") o.json = true;
    else if (a == "--quick") o.max_bytes = std::int64_t{16} << 20, o.reps = 3;
    else if (a == "--members" && (n = args.int_value(1, 64))) o.members = static_cast<int>(*n);
    else if (a == "--min-bytes" && (n = args.int_value(4, std::int64_t{1} << 34))) o.min_bytes = *n;
    else if (a == "--max-bytes" && (n = args.int_value(4, std::int64_t{1} << 34))) o.max_bytes = *n, o.max_bytes_given = true;
    else if (a == "--reps" && (n = args.int_value(1, 1000))) o.reps = static_cast<int>(*n);
    else if (a == "--unchecked-first") o.unchecked_first = true;
    else if (a == "--per-rep") o.per_rep = true;
    else if (a == "--flight-recorder") o.flight_recorder = true;
    else if (a == "--nccl-check") o.nccl_check = true;
    else {
      std::fprintf(stderr, "weft-bench-allreduce: bad argument '%s' (a flag needs a number in range)\n", a.c_str());
      return usage(stderr, 2);
    }
  }
  const double rtt = weft_bench::core_round_trip_ns();
  auto engine = weft::Engine::create({.kind = "threaded", .cpu_devices = o.members, .workers_per_cpu_device = 1});
  namespace par = weft::parallel;
  // Weft initializes MPI (MPI_THREAD_MULTIPLE, so that this thread may call
  // MPI_Allreduce too) and finalizes it at exit.
  // Communicators are created collectively, in the same order on every rank
  // (every rank parses the same flags).
  std::optional<par::Communicator> checked_comm, unchecked_comm;
  auto make_checked = [&] { checked_comm = par::Communicator::mpi(*engine, weft::Device::cpu(0)); };
  auto make_unchecked = [&] {
    unchecked_comm = par::Communicator::mpi(*engine, weft::Device::cpu(0), {.fingerprints = false});
  };
  if (o.unchecked_first) make_unchecked();
  make_checked();
  if (!o.unchecked_first) make_unchecked();
  const par::Communicator& across = *checked_comm;
  const par::Communicator& unchecked = *unchecked_comm;
  // weft_mpi_4_in_flight on a communicator of its own, so that what one row
  // leaves behind (its lane thread, its MPI communicators) does not fall on
  // another row: with the communicator shared, weft_mpi / weft_mpi_unchecked
  // measured 1.02-1.08 at 16 MiB, apart 0.85-0.95 (three runs each, one
  // machine; docs/performance.md, "Design choices").
  const par::Communicator in_flight = par::Communicator::mpi(*engine, weft::Device::cpu(0));
  const Job job{across.local_ranks()[0], across.size()};
  const bool json = o.json, print_here = job.rank == 0;
  std::vector<weft::Device> devices;
  for (int r = 0; r < o.members; ++r) devices.push_back(weft::Device::cpu(r));
  const par::Communicator comm = par::Communicator::local(*engine, devices);
  // GPU members where GPUs answer.
  const int gpus = std::min(o.members, weft::gpu::device_count());
  const bool simulated = gpus > 0 && weft::gpu::properties(0).simulated;
  const std::string gpu_suffix = simulated ? "_sim_gpu" : "_gpu";
  std::string gpu_ring_impl = "weft_ring" + gpu_suffix, gpu_mpi_impl = "weft_mpi" + gpu_suffix;
  std::vector<weft::Device> gpu_devices;
  for (int r = 0; r < gpus; ++r) gpu_devices.push_back(weft::Device::gpu(r));
  std::optional<par::Communicator> gpu_comm, gpu_across;
  if (gpus > 0) {
    gpu_comm = par::Communicator::local(*engine, gpu_devices);
    gpu_across = par::Communicator::mpi(*engine, weft::Device::gpu(0));
    if (gpu_comm->str().find("NCCL") != std::string::npos) gpu_ring_impl = "weft_nccl_gpu";
    if (gpu_across->str().find("NCCL") != std::string::npos) gpu_mpi_impl = "weft_nccl_mpi_gpu";
  }
  if (print_here) {
    std::fprintf(json ? stderr : stdout,
                 "weft-bench-allreduce: %s; %s; %d CPUs to run on (of %u hardware threads), core round trip %.1f ns\n",
                 comm.str().c_str(), across.str().c_str(), weft::available_cpus(), std::thread::hardware_concurrency(),
                 rtt);
    if (!json)
      std::printf("%-20s %5s %12s %12s %10s %10s\n", "impl", "ranks", "bytes", "time_us", "algbw_GB/s", "busbw_GB/s");
  }
  auto report = [&](const Row& row) {
    if (print_here) print(row, json, rtt);
  };

  if (o.nccl_check) {
    if (job.size == 1) {
      if (print_here) std::fprintf(stderr, "weft-bench-allreduce --nccl-check: run it under mpirun (2 or more ranks)\n");
      return 0;
    }
    namespace detail = par::detail;
    const par::Communicator checks = par::Communicator::mpi(*engine, weft::Device::cpu(0));
    weft::Tensor x = weft::Tensor::full(*engine, weft::Shape{1}, 1.0f, weft::Device::cpu(0));
    engine->wait_all();
    // One call: the check pushed with its input ready, and the launch's hold
    // op (NCCL's reads the token and holds the tensor; run inline), whose
    // body notes when it runs. The next call begins once this one is over:
    // its launch ran and, ahead, its statuses settled (NCCL's hold op
    // completes only then). What is timed is push to launch.
    auto call_us = [&](bool ahead, int skew_us) {
      if (job.rank != 0 && skew_us > 0)  // this rank's input is ready later than rank 0's: its producer runs longer
        weft::push_tensor_op(weft::Device::cpu(0), {}, {x}, [skew_us](weft::RunContext&, const weft::TensorData&) {
          const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(skew_us);
          while (std::chrono::steady_clock::now() < until) {
          }
        }, {.name = "late producer"});
      weft::Tensor token = weft::Tensor::empty(*engine, weft::Shape{0}, weft::Device::cpu(0));
      std::shared_ptr<detail::CheckAfter> after = ahead ? std::make_shared<detail::CheckAfter>() : nullptr;
      auto launched = std::make_shared<std::chrono::steady_clock::time_point>();
      const auto pushed = std::chrono::steady_clock::now();
      detail::check_across(checks, detail::Kind::allreduce, x, {x}, token, par::ReduceOp::sum, {.name = "grad"},
                           after);
      weft::push_tensor_op_async(
          weft::Device::cpu(0), {token}, {x},
          [launched](weft::RunContext&, const weft::TensorData&, weft::Completion done) {
            *launched = std::chrono::steady_clock::now();
            done();
          },
          {.name = "launch", .run_inline = true});
      engine->wait_to_read(x.var());
      if (after)
        while (!after->settled.load(std::memory_order_acquire)) std::this_thread::yield();
      return std::chrono::duration<double, std::micro>(*launched - pushed).count();
    };
    constexpr int kCalls = 200;
    for (const int skew_us : {0, 100}) {
      std::vector<double> meeting, ahead;  // per rep: rank 0's median call's push-to-launch time
      for (int r = 0; r < o.reps; ++r)
        for (int which = 0; which < 2; ++which) {
          const bool is_ahead = (which == 0) == (r % 2 == 0);  // alternate which goes first
          MPI_Barrier(MPI_COMM_WORLD);
          call_us(is_ahead, skew_us);  // untimed
          std::vector<double> us;
          for (int k = 0; k < kCalls; ++k) us.push_back(call_us(is_ahead, skew_us));
          (is_ahead ? ahead : meeting).push_back(weft_bench::summarize(us).median);
        }
      const std::string suffix = skew_us ? "_skew" + std::to_string(skew_us) + "us" : "";
      report({"nccl_check_meeting" + suffix, job.size, 4, weft_bench::summarize(meeting).median});
      report({"nccl_check_ahead" + suffix, job.size, 4, weft_bench::summarize(ahead).median,
              "nccl_check_meeting" + suffix, paired_ratio(ahead, meeting)});
    }
    return 0;
  }

  if (o.flight_recorder) {
    // The recorder on (2000 entries) against off, one implementation at a
    // time, the two's reps interleaved; switched only in a rep's untimed
    // first call (switching empties the ring).
    auto recorder = [](std::size_t entries) {
      if (par::flight_recorder_capacity() != entries) par::set_flight_recorder_capacity(entries);
    };
    const std::size_t on = 2000;
    const std::int64_t max_bytes = o.max_bytes_given ? o.max_bytes : 4096;
    for (std::int64_t bytes = o.min_bytes; bytes <= max_bytes; bytes *= 4) {
      const std::int64_t count = bytes / 4;
      job.rank0_alone([&] {
        std::vector<weft::Tensor> t;
        for (int r = 0; r < o.members; ++r)
          t.push_back(weft::Tensor::full(*engine, weft::Shape{count}, 1.0f, devices[static_cast<std::size_t>(r)]));
        engine->wait_all();
        auto ring = [&](std::size_t entries) {
          return [&, entries](int calls) {
            recorder(entries);
            for (int c = 0; c < calls; ++c) par::allreduce(comm, t);
            engine->wait_all();
          };
        };
        const auto run_on = ring(on), run_off = ring(0);
        const int calls = std::max(calls_for_50ms(run_on, false), calls_for_50ms(run_off, false));
        std::vector<double> us_on, us_off;
        for (int r = 0; r < o.reps; ++r)
          for (int which = 0; which < 2; ++which) {
            const bool first_on = r % 2 == 0;  // alternate which goes first
            const bool is_on = (which == 0) == first_on;
            const auto& run = is_on ? run_on : run_off;
            run(1);
            weft_bench::Stopwatch sw;
            run(calls);
            (is_on ? us_on : us_off).push_back(sw.seconds() * 1e6 / calls);
          }
        report({"weft_ring_recorder_off", o.members, bytes, weft_bench::summarize(us_off).median});
        report({"weft_ring_recorder_on", o.members, bytes, weft_bench::summarize(us_on).median,
                "weft_ring_recorder_off", paired_ratio(us_on, us_off)});
      });
      if (job.size == 1) continue;
      weft::Tensor t = weft::Tensor::full(*engine, weft::Shape{count}, 1.0f, weft::Device::cpu(0));
      engine->wait_all();
      auto mpi = [&](std::size_t entries) {
        return [&, entries](int calls) {
          recorder(entries);
          for (int k = 0; k < calls; ++k) par::allreduce(across, {t});
          engine->wait_all();
        };
      };
      const std::vector<Impl> impls = {{"weft_mpi_recorder_on", mpi(on)}, {"weft_mpi_recorder_off", mpi(0)}};
      const std::vector<std::vector<double>> us = times_per_call_us_together(o.reps, impls);
      report({"weft_mpi_recorder_off", job.size, bytes, weft_bench::summarize(us[1]).median});
      report({"weft_mpi_recorder_on", job.size, bytes, weft_bench::summarize(us[0]).median, "weft_mpi_recorder_off",
              paired_ratio(us[0], us[1])});
    }
    recorder(on);
    return 0;
  }

  for (std::int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    const std::int64_t count = bytes / 4;
    job.rank0_alone([&] {
      std::vector<weft::Tensor> t;
      for (int r = 0; r < o.members; ++r) t.push_back(weft::Tensor::full(*engine, weft::Shape{count}, 1.0f, devices[r]));
      engine->wait_all();
      const double ring_us = time_per_call_us_alone(o.reps, [&](int calls) {
        for (int c = 0; c < calls; ++c) par::allreduce(comm, t);
        engine->wait_all();
      });
      report({"weft_ring", o.members, bytes, ring_us});
      std::vector<char> src(static_cast<std::size_t>(bytes), 1), dst(static_cast<std::size_t>(bytes));
      const double memcpy_us = time_per_call_us_alone(o.reps, [&](int calls) {
        for (int c = 0; c < calls; ++c) {
          std::memcpy(dst.data(), src.data(), src.size());
          src[static_cast<std::size_t>(c) % src.size()] ^= 1;  // keep the copies from being merged
        }
      });
      report({"memcpy", 1, bytes, memcpy_us});
      if (!gpu_comm) return;
      std::vector<weft::Tensor> g;
      for (int r = 0; r < gpus; ++r)
        g.push_back(weft::Tensor::full(*engine, weft::Shape{count}, 1.0f, gpu_devices[static_cast<std::size_t>(r)]));
      engine->wait_all();
      const double gpu_ring_us = time_per_call_us_alone(o.reps, [&](int calls) {
        for (int c = 0; c < calls; ++c) par::allreduce(*gpu_comm, g);
        engine->wait_all();
      });
      report({gpu_ring_impl, gpus, bytes, gpu_ring_us});
#if WEFT_BENCH_NCCL
      if (!simulated) report({"nccl", gpus, bytes, direct_nccl_us(gpus, count, o.reps)});
#endif
    });
    if (job.size == 1) continue;
    if (gpu_across) {
      weft::Tensor g = weft::Tensor::full(*engine, weft::Shape{count}, 1.0f, weft::Device::gpu(0));
      engine->wait_all();
      const Impl impl{gpu_mpi_impl.c_str(), [&](int calls) {
                        for (int k = 0; k < calls; ++k) par::allreduce(*gpu_across, {g});
                        engine->wait_all();
                      }};
      const double us = weft_bench::summarize(times_per_call_us_together(o.reps, {impl})[0]).median;
      report({gpu_mpi_impl, job.size, bytes, us});
    }
    // Across the ranks: weft_mpi and weft_mpi_unchecked on one tensor, plain
    // MPI on a vector of the same size, each touched before its first timed
    // call.
    weft::Tensor t = weft::Tensor::full(*engine, weft::Shape{count}, 1.0f, weft::Device::cpu(0));
    engine->wait_all();
    auto weft_calls = [&](const par::Communicator& c) {
      return [&](int calls) {
        for (int k = 0; k < calls; ++k) par::allreduce(c, {t});
        engine->wait_all();
      };
    };
    // Four buffers in flight, as a data-parallel step's gradient buckets
    // are: one collective's fingerprints and engine hand-offs overlap the
    // data phase of the one before.
    std::vector<weft::Tensor> bucket;
    for (int k = 0; k < 4; ++k) bucket.push_back(weft::Tensor::full(*engine, weft::Shape{count}, 1.0f, weft::Device::cpu(0)));
    engine->wait_all();
    std::vector<float> buffer(static_cast<std::size_t>(count), 1.0f);
    // Plain MPI over four buffers in turn: the peer of weft_mpi_4_in_flight,
    // whose working set is four times one buffer's (at 16 MiB one buffer
    // stays in the cache between calls, four do not).
    std::vector<std::vector<float>> buffers(4, std::vector<float>(static_cast<std::size_t>(count), 1.0f));
    const std::vector<Impl> impls = {
        {"weft_mpi", weft_calls(across)},
        {"weft_mpi_unchecked", weft_calls(unchecked)},
        {"weft_mpi_4_in_flight",
         [&](int calls) {
           for (int k = 0; k < calls; ++k) par::allreduce(in_flight, {bucket[static_cast<std::size_t>(k % 4)]});
           engine->wait_all();
         }},
        {"mpi",
         [&](int calls) {
           for (int k = 0; k < calls; ++k)
             MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
         }},
        {"mpi_4_buffers", [&](int calls) {
           for (int k = 0; k < calls; ++k)
             MPI_Allreduce(MPI_IN_PLACE, buffers[static_cast<std::size_t>(k % 4)].data(), static_cast<int>(count),
                           MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
         }}};
    auto print_rep = [&](const Rep& r) {
      if (!o.per_rep || !print_here) return;
      std::printf("{\"rep_of\":\"%s\",\"ranks\":%d,\"bytes\":%lld,\"rep\":%d,\"after\":\"%s\",\"calls\":%d,"
                  "\"time_us\":%.3f}\n",
                  impls[r.impl].name, job.size, static_cast<long long>(bytes), r.rep, impls[r.after].name, r.calls,
                  r.us_per_call);
      std::fflush(stdout);
    };
    const std::vector<std::vector<double>> us = times_per_call_us_together(o.reps, impls, print_rep);
    const std::vector<int> peer_of = {3, 3, 4, -1, -1};  // index of each row's peer in `impls`
    for (std::size_t i = 0; i < impls.size(); ++i) {
      Row row{impls[i].name, job.size, bytes, weft_bench::summarize(us[i]).median};
      if (peer_of[i] >= 0) {
        const auto p = static_cast<std::size_t>(peer_of[i]);
        row.peer = impls[p].name;
        row.vs_peer = paired_ratio(us[i], us[p]);
      }
      report(row);
    }
  }
  return 0;
}
