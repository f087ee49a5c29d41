#include "demo_support.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <weft/error.h>
#include <weft/gpu.h>
#include <weft/ops.h>

#include "arg_cursor.h"

namespace weft::demo {

DemoCli::DemoCli(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

void DemoCli::add(const char* flag, std::int64_t* target, const char* help) {
  flags_.push_back({flag, help, [flag, target](const std::string& v) {
                      std::size_t used = 0;
                      long long n = 0;
                      try {
                        n = std::stoll(v, &used);
                      } catch (...) {
                        used = 0;
                      }
                      if (used != v.size() || n <= 0)
                        throw UsageError(std::string(flag) + " needs a positive integer, got '" + v + "'");
                      *target = n;
                    },
                    nullptr, std::to_string(*target)});
}

void DemoCli::add(const char* flag, double* target, const char* help) {
  std::ostringstream d;
  d << *target;
  flags_.push_back({flag, help, [flag, target](const std::string& v) {
                      std::size_t used = 0;
                      double x = 0;
                      try {
                        x = std::stod(v, &used);
                      } catch (...) {
                        used = 0;
                      }
                      if (used != v.size() || !(x > 0))
                        throw UsageError(std::string(flag) + " needs a positive number, got '" + v + "'");
                      *target = x;
                    },
                    nullptr, d.str()});
}

void DemoCli::add(const char* flag, std::string* target, const char* help) {
  flags_.push_back({flag, help, [target](const std::string& v) { *target = v; }, nullptr, *target});
}

void DemoCli::add(const char* flag, bool* target, const char* help) {
  flags_.push_back({flag, help, nullptr, target, ""});
}

std::string DemoCli::usage() const {
  std::ostringstream os;
  os << "usage: " << program_ << " [options]\n\n" << summary_ << "\n\noptions:\n";
  auto line = [&](const std::string& left, const std::string& help) {
    os << "  " << left << std::string(left.size() < 22 ? 22 - left.size() : 1, ' ') << help << '\n';
  };
  for (const Flag& f : flags_)
    line(f.name + (f.set ? " N" : ""), f.help + (f.default_text.empty() ? "" : " (default " + f.default_text + ")"));
  line("--engine KIND", "threaded (default) or naive");
  line("--trace FILE", "write the measured phase as a chrome://tracing / Perfetto JSON trace");
  line("--json", "end with one JSON line of the measured figures");
  line("--help", "this text");
  os << "\nEnvironment: WEFT_CPU_WORKERS, WEFT_GPU_DEVICES, WEFT_PROFILE_SUMMARY=1 (see README).\n";
  return os.str();
}

bool DemoCli::parse(int argc, char** argv, CommonOptions& common) {
  weft::examples::ArgCursor args(argc, argv);
  while (args.next()) {
    const std::string& arg = args.flag();
    auto take = [&]() -> std::string {
      std::optional<std::string> v = args.value();
      if (!v) throw UsageError(arg + " needs a value");
      return *std::move(v);
    };
    if (arg == "--help" || arg == "-h") {
      std::cout << usage();
      return false;
    }
    if (arg == "--json") {
      if (args.has_inline_value()) throw UsageError("--json takes no value");
      common.json = true;
      continue;
    }
    if (arg == "--trace") {
      common.trace_path = take();
      continue;
    }
    if (arg == "--engine") {
      common.engine = take();
      if (common.engine != "threaded" && common.engine != "naive")
        throw UsageError("--engine is threaded or naive, got '" + common.engine + "'");
      continue;
    }
    auto it = std::find_if(flags_.begin(), flags_.end(), [&](const Flag& f) { return f.name == arg; });
    if (it == flags_.end()) throw UsageError("unknown argument '" + arg + "' (see --help)");
    if (it->set) it->set(take());
    else if (args.has_inline_value()) throw UsageError(arg + " takes no value");
    else *it->on = true;
  }
  return true;
}

int demo_main(const char* program, DemoCli& cli, int argc, char** argv, CommonOptions& common,
              const std::function<nlohmann::json()>& run) {
  try {
    if (!cli.parse(argc, argv, common)) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 2;
  }
  try {
    nlohmann::json figures = run();
    if (common.json) std::cout << figures.dump() << std::endl;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double overlap_efficiency(double a, double b, double both) {
  const double shorter = std::min(a, b);
  return shorter > 0 ? (a + b - both) / shorter : 0.0;
}

void Table::print() const {
  std::vector<std::size_t> w(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& r) {
    for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  };
  widen(header_);
  for (const auto& r : rows_) widen(r);
  auto print_row = [&](const std::vector<std::string>& r) {
    std::string line = " ";
    for (std::size_t i = 0; i < w.size(); ++i) {
      const std::string cell = i < r.size() ? r[i] : "";
      // First column left-aligned (labels), the others right-aligned (numbers).
      if (i == 0) line += cell + std::string(w[i] - cell.size(), ' ');
      else line += std::string(w[i] - cell.size(), ' ') + cell;
      line += i + 1 < w.size() ? "  " : "";
    }
    std::printf("%s\n", line.c_str());
  };
  print_row(header_);
  std::size_t total = 1;
  for (std::size_t x : w) total += x + 2;
  std::printf(" %s\n", std::string(total - 3, '-').c_str());
  for (const auto& r : rows_) print_row(r);
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}
std::string ms(double seconds) { return fixed(seconds * 1e3, 3) + " ms"; }
std::string mib(double bytes) { return fixed(bytes / (1024.0 * 1024.0), 1) + " MiB"; }

std::unique_ptr<Engine> make_engine(const CommonOptions& common, EngineConfig config) {
  if (config.kind.empty()) config.kind = common.engine;
  return Engine::create(std::move(config));
}

bool has_gpu(Engine& engine) {
  for (const Device& d : engine.devices())
    if (d.is_gpu()) return true;
  return false;
}

std::string hardware(Engine& engine) {
  std::string out;
  for (const Device& d : engine.devices()) {
    if (!out.empty()) out += ", ";
    out += d.str();
    if (d.is_gpu()) out += " " + gpu::describe(d.index());
    else out += " (" + std::to_string(engine.workers(d)) + " worker" + (engine.workers(d) > 1 ? "s" : "") + ")";
  }
  if (!has_gpu(engine)) out += "; no GPU";
  out += "; " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads";
  return out;
}

void traced(Engine& engine, const CommonOptions& common, const std::function<void()>& f) {
  if (common.trace_path.empty()) {
    f();
    return;
  }
  engine.wait_all();
  engine.profiler().clear();
  engine.profiler().start();
  f();
  engine.wait_all();
  engine.profiler().stop();
  engine.profiler().dump(common.trace_path);
}

void print_trace_note(Engine& engine, const CommonOptions& common) {
  if (common.trace_path.empty() || common.quiet) return;
  std::printf("\n trace of the measured phase: %s (ui.perfetto.dev, chrome://tracing, or\n"
              " scripts/trace-summary %s); what the engine saw in it:\n%s",
              common.trace_path.c_str(), common.trace_path.c_str(), engine.profiler().summarize().table().c_str());
}

ScopedKernelThreads::ScopedKernelThreads(int n) : saved_(ops::cpu_kernel_threads()) { ops::set_cpu_kernel_threads(n); }
ScopedKernelThreads::~ScopedKernelThreads() { ops::set_cpu_kernel_threads(saved_); }

OverlapEngine make_overlap_engine(const CommonOptions& common, int cpu_devices_without_gpu,
                                  int cpu_devices_with_gpu) {
  OverlapEngine out;
  out.gpus = gpu::device_count();
  out.gpu_backend = std::string(gpu::to_string(gpu::backend()));
  out.simulated = out.gpus > 0 && gpu::properties(0).simulated;
  if (out.gpus > 0) {
    EngineConfig config{.cpu_devices = cpu_devices_with_gpu};
    if (out.simulated) {
      // A simulated kernel holds a host core for its CPU time: one core per
      // kernel, and one compute stream per GPU, so that two kernels of one
      // GPU never take both cores of a small machine from its copy engines
      // (a real GPU shares its SMs between its streams instead).
      out.kernel_threads = std::make_unique<ScopedKernelThreads>(1);
      config.compute_streams_per_gpu = 1;
    }
    out.engine = make_engine(common, std::move(config));
  } else {
    out.kernel_threads = std::make_unique<ScopedKernelThreads>(1);
    out.engine = make_engine(common, {.cpu_devices = cpu_devices_without_gpu, .workers_per_cpu_device = 1});
  }
  return out;
}

std::size_t current_rss() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

Footprint measure_footprint(const std::function<void()>& f) {
  Footprint out;
  out.start_rss = current_rss();
  std::atomic<bool> done{false};
  std::atomic<std::size_t> peak{out.start_rss};
  std::thread sampler([&] {
    while (!done.load(std::memory_order_acquire)) {
      const std::size_t now = current_rss();
      if (now > peak.load(std::memory_order_relaxed)) peak.store(now, std::memory_order_relaxed);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  try {
    out.seconds = time_seconds(f);
  } catch (...) {
    done.store(true, std::memory_order_release);
    sampler.join();
    throw;
  }
  done.store(true, std::memory_order_release);
  sampler.join();
  out.peak_rss = std::max(peak.load(), current_rss());
  return out;
}

}  // namespace weft::demo
