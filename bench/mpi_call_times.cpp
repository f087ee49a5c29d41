// weft-mpi-call-times: an MPI profiling interposer (PMPI, loaded with
// LD_PRELOAD) that splits the timed batches of weft-bench-allreduce into
// the time spent inside blocking MPI_Allreduce calls and the time outside
// them (bench/README.md; docs/performance.md, "Collectives").
//
// Why: plain MPI's own speed moves 10-20% between runs and more between
// repetitions, so a ratio of two implementations' times mixes what Weft
// adds around a call with where the slow spells fell. Timing the calls
// themselves, on whatever thread makes them (Weft's blocking lane, the
// bench's main thread), tells the two apart: time outside MPI per call is
// what Weft's engine, fibers and hand-offs cost on this rank; time inside
// is MPI's work, the wait for the last rank to join (a peer's own overhead
// shows there) and any preemption during the call.
//
// The bench opens a window around each timed batch with
// MPI_Pcontrol(kCallTimesOpen, "implementation name") and closes it with
// MPI_Pcontrol(kCallTimesClose) (mpi_call_times.h; other levels are
// ignored). Without the interposer those calls do nothing. Every
// MPI_Allreduce made while a window is open, from any thread, counts in
// it; non-blocking allreduces (Weft below 256 KiB) are not timed: their
// time inside MPI is spread over MPI_Test calls.
//
// At MPI_Finalize, rank 0 of MPI_COMM_WORLD prints one JSON line per
// window that timed a call on stdout: window_of (the name), ranks, bytes
// (of its calls), calls, off_thread_calls (made on another thread than the
// one that opened the window), window_us, in_mpi_us (the sum of the calls'
// durations), longest_call_us and involuntary_switches (the calling
// threads' preemptions during the calls, from getrusage(RUSAGE_THREAD)).
// scripts/allreduce-summary reads them. Time inside a collective includes
// the wait for the last rank to join it, so a peer's lateness shows there.
#include <mpi.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mpi_call_times.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Window {
  std::string name;
  std::thread::id opener;
  Clock::time_point opened;
  double window_us = 0;
  long long bytes = 0;
  int calls = 0, off_thread_calls = 0;
  double in_mpi_us = 0, longest_call_us = 0;
  long involuntary_switches = 0;
};

std::mutex g_mutex;
std::vector<Window> g_closed;  // guarded by g_mutex
Window g_open;                 // guarded by g_mutex
bool g_is_open = false;        // guarded by g_mutex
// Counts the windows opened: a call counts in the window open when it
// started, and only if that one is still open when it returns.
unsigned long g_generation = 0;  // guarded by g_mutex

// Moves the open window to the closed ones. Under g_mutex.
void close_window() {
  g_open.window_us = std::chrono::duration<double, std::micro>(Clock::now() - g_open.opened).count();
  g_closed.push_back(std::move(g_open));
  g_open = Window{};
  g_is_open = false;
}

long involuntary_switches() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_nivcsw;
}

void json_string(std::FILE* out, const std::string& s) {
  std::fputc('"', out);
  for (const char c : s) {
    if (c == '"' || c == '\\') std::fputc('\\', out);
    if (static_cast<unsigned char>(c) < 0x20) {
      std::fprintf(out, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
    } else {
      std::fputc(c, out);
    }
  }
  std::fputc('"', out);
}

}  // namespace

extern "C" {

int MPI_Pcontrol(const int level, ...) {
  std::lock_guard lock(g_mutex);
  if (level == weft_bench::kCallTimesOpen) {
    va_list args;
    va_start(args, level);
    const char* name = va_arg(args, const char*);
    va_end(args);
    if (g_is_open) close_window();  // opened without a close: it ends here
    g_open.name = name ? name : "";
    g_open.opener = std::this_thread::get_id();
    g_open.opened = Clock::now();
    g_is_open = true;
    ++g_generation;
  } else if (level == weft_bench::kCallTimesClose && g_is_open) {
    close_window();
  }
  return MPI_SUCCESS;
}

int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  bool open;
  unsigned long generation;
  {
    std::lock_guard lock(g_mutex);
    open = g_is_open;
    generation = g_generation;
  }
  if (!open) return PMPI_Allreduce(send, recv, count, type, op, comm);  // never under g_mutex
  const long switches_before = involuntary_switches();
  const Clock::time_point start = Clock::now();
  const int rc = PMPI_Allreduce(send, recv, count, type, op, comm);
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  const long switches = involuntary_switches() - switches_before;
  int size = 0;
  PMPI_Type_size(type, &size);
  std::lock_guard lock(g_mutex);
  if (g_is_open && g_generation == generation) {  // a call that outlived its window counts in none
    Window& w = g_open;
    w.bytes = static_cast<long long>(count) * size;
    ++w.calls;
    if (std::this_thread::get_id() != w.opener) ++w.off_thread_calls;
    w.in_mpi_us += us;
    if (us > w.longest_call_us) w.longest_call_us = us;
    w.involuntary_switches += switches;
  }
  return rc;
}

int MPI_Finalize() {
  int rank = 0, ranks = 1;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (rank == 0) {
    std::lock_guard lock(g_mutex);
    for (const Window& w : g_closed) {
      if (w.calls == 0) continue;  // its calls were non-blocking (or none)
      std::fputs("{\"window_of\":", stdout);
      json_string(stdout, w.name);
      std::printf(
          ",\"ranks\":%d,\"bytes\":%lld,\"calls\":%d,\"off_thread_calls\":%d,\"window_us\":%.3f,\"in_mpi_us\":%.3f,"
          "\"longest_call_us\":%.3f,\"involuntary_switches\":%ld}\n",
          ranks, w.bytes, w.calls, w.off_thread_calls, w.window_us, w.in_mpi_us, w.longest_call_us,
          w.involuntary_switches);
    }
    std::fflush(stdout);
  }
  return PMPI_Finalize();
}

}  // extern "C"
