// What the overlap demos share: flags (each demo's own plus --trace, --json,
// --engine, --help), timing, a printed table, the JSON line, memory readings
// and the trace of the phase that matters.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <weft/engine.h>

namespace weft::demo {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Flags every demo takes.
struct CommonOptions {
  std::string trace_path;  // --trace: the measured phase as a Perfetto/chrome://tracing JSON
  bool json = false;       // --json: end with one JSON line of the figures
  std::string engine;      // --engine threaded|naive (default threaded)
  bool quiet = false;      // the tour prints its own summary
};

class DemoCli {
 public:
  DemoCli(std::string program, std::string summary);
  void add(const char* flag, std::int64_t* target, const char* help);
  void add(const char* flag, double* target, const char* help);
  void add(const char* flag, std::string* target, const char* help);
  void add(const char* flag, bool* target, const char* help);
  // Returns false after printing --help. Throws UsageError naming the flag.
  bool parse(int argc, char** argv, CommonOptions& common);
  std::string usage() const;

 private:
  struct Flag {
    std::string name, help;
    std::function<void(const std::string&)> set;  // null: a switch
    bool* on = nullptr;
    std::string default_text;
  };
  std::string program_, summary_;
  std::vector<Flag> flags_;
};

// Runs `run` (which prints its table and returns its figures), then the JSON
// line when asked; usage errors exit 2, failures 1.
int demo_main(const char* program, DemoCli& cli, int argc, char** argv, CommonOptions& common,
              const std::function<nlohmann::json()>& run);

double seconds_since(std::chrono::steady_clock::time_point t0);
template <class F>
double time_seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return seconds_since(t0);
}
double median(std::vector<double> v);

// Overlap efficiency of two phases run alone (a, b) and together (both):
// (a + b - both) / min(a, b): 1 when the shorter hides entirely, 0 when serial.
double overlap_efficiency(double a, double b, double both);

// A fixed-width table printed to stdout.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void print() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};
std::string ms(double seconds);          // "12.345 ms"
std::string mib(double bytes);           // "12.3 MiB"
std::string fixed(double v, int digits);  // "0.95"

// The engine for a demo: kind from --engine, the rest from the arguments.
std::unique_ptr<Engine> make_engine(const CommonOptions& common, EngineConfig config = {});
// "gpu(0) NVIDIA H100 ... + cpu(0) (2 workers)" or "cpu(0), cpu(1) (no GPU)".
std::string hardware(Engine& engine);
bool has_gpu(Engine& engine);

// Records the phase `f` runs when --trace was given: clears and starts the
// profiler, runs f, waits for the engine and writes the trace. Without
// --trace it just runs f.
void traced(Engine& engine, const CommonOptions& common, const std::function<void()>& f);
// After a demo's table: where the trace went and the profiler's per-resource
// summary of it (nothing without --trace).
void print_trace_note(Engine& engine, const CommonOptions& common);

// Sets the threads each CPU kernel may use for the scope of a demo.
class ScopedKernelThreads {
 public:
  explicit ScopedKernelThreads(int n);
  ~ScopedKernelThreads();
  ScopedKernelThreads(const ScopedKernelThreads&) = delete;
  ScopedKernelThreads& operator=(const ScopedKernelThreads&) = delete;

 private:
  int saved_;
};

// An engine for the overlap demos: with a GPU, the GPUs and
// `cpu_devices_with_gpu` CPU devices; without,
// `cpu_devices` CPU devices standing in for them, one worker and one kernel
// thread each, so that each device owns a core and overlap is measurable.
struct OverlapEngine {
  // CPU form and simulated GPUs: one kernel thread per op, so the devices (or
  // the simulated GPU's kernels and its copies) each have a core. Outlives
  // the engine's ops.
  std::unique_ptr<ScopedKernelThreads> kernel_threads;
  std::unique_ptr<Engine> engine;
  int gpus = 0;
  bool simulated = false;    // the GPUs are simulated (WEFT_GPU_BACKEND=sim): GPU work at CPU speed
  std::string gpu_backend;   // "cuda" | "sim" | "none", for the --json line
};
OverlapEngine make_overlap_engine(const CommonOptions& common, int cpu_devices_without_gpu,
                                  int cpu_devices_with_gpu = 1);

// Peak resident memory of the process while `f` runs, sampled every
// millisecond from /proc/self/statm (0 where there is no /proc).
struct Footprint {
  double seconds = 0;
  std::size_t peak_rss = 0;   // bytes
  std::size_t start_rss = 0;  // bytes, when f started
};
Footprint measure_footprint(const std::function<void()>& f);
std::size_t current_rss();

}  // namespace weft::demo
