// weft::Profiler: spans and the per-op table; its recording side
// (ProfilerRecorder: tracks, spans, pushes). Threading contracts:
// weft/profiler.h and profiler_recorder.h; storage: profiler_impl.h.
#include "profiler_impl.h"

#include <map>
#include <deque>
#include <algorithm>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "weft/error.h"
#include "weft/gpu_sim.h"

namespace weft {

namespace detail {
std::int64_t process_id(Device d) { return 1 + 100000 * static_cast<std::int64_t>(d.kind()) + d.index(); }
std::string_view display_name(std::string_view name) { return name.empty() ? std::string_view("(unnamed)") : name; }
}  // namespace detail

using detail::display_name;

std::string_view to_string(TrackKind kind) noexcept {
  switch (kind) {
    case TrackKind::worker: return "worker";
    case TrackKind::launch: return "launch";
    case TrackKind::stream: return "stream";
  }
  return "?";
}

namespace {

struct Notes {
  std::mutex mu;
  std::map<std::string, std::string> by_key;
};

Notes& process_notes() {
  static Notes notes;  // process-wide: the kernels that write notes see no profiler
  return notes;
}

}  // namespace

void Profiler::note(std::string key, std::string text) {
  Notes& n = process_notes();
  const std::lock_guard<std::mutex> lock(n.mu);
  n.by_key.insert_or_assign(std::move(key), std::move(text));
}

std::vector<std::pair<std::string, std::string>> Profiler::notes() {
  Notes& n = process_notes();
  const std::lock_guard<std::mutex> lock(n.mu);
  return {n.by_key.begin(), n.by_key.end()};
}

void Profiler::clear_notes() {
  Notes& n = process_notes();
  const std::lock_guard<std::mutex> lock(n.mu);
  n.by_key.clear();
}

Profiler::Profiler() : impl_(std::make_unique<Impl>()) {}
Profiler::~Profiler() = default;

void Profiler::start() { running_.store(true, std::memory_order_relaxed); }
void Profiler::stop() { running_.store(false, std::memory_order_relaxed); }

void Profiler::clear() {
  {
    std::lock_guard lock(impl_->tracks_mu);
    for (auto& t : impl_->tracks) t->clear();
  }
  std::lock_guard lock(impl_->samples_mu);
  impl_->counters.clear();
  impl_->pushes.clear();
  impl_->var_names.clear();
}

namespace {
using ProfilerClock = std::chrono::steady_clock;
// Never destroyed with a static's order problems: a plain value, set once.
const ProfilerClock::time_point& profiler_epoch() noexcept {
  static const ProfilerClock::time_point epoch = ProfilerClock::now();
  return epoch;
}
}  // namespace

std::int64_t Profiler::now_ns() noexcept {
  // Under the simulator's modeled mode the host's modeled clock (this
  // thread's: the op's issue time inside an engine op), on the same
  // steady-clock timeline.
  const double modeled = gpu::modeled_issue_time();
  if (modeled >= 0) return detail::profiler_ns_of_modeled(modeled);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(ProfilerClock::now() - profiler_epoch()).count();
}

namespace detail {

std::int64_t profiler_ns_of_modeled(double seconds) noexcept {
  const auto epoch_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(profiler_epoch().time_since_epoch()).count();
  return static_cast<std::int64_t>(std::llround(seconds * 1e9)) - epoch_ns;
}

ProfilerTrack* ProfilerRecorder::track(Device device, int index, std::string label, TrackKind kind,
                                      std::string resource) {
  if (index < 0)
    throw InvalidArgument("weft::Profiler: negative track index " + std::to_string(index) + " for " + device.str());
  Profiler::Impl& impl = *profiler_.impl_;
  std::lock_guard lock(impl.tracks_mu);
  auto [it, inserted] = impl.by_key.try_emplace({device, index}, nullptr);
  if (!inserted) return it->second;  // the first label wins
  try {
    if (label.empty()) label = device.str() + " worker " + std::to_string(index);
    if (resource.empty()) resource = device.str() + " workers";
    impl.tracks.push_back(std::make_unique<ProfilerTrack>(device, index, std::move(label), kind, std::move(resource)));
  } catch (...) {
    impl.by_key.erase(it);
    throw;
  }
  it->second = impl.tracks.back().get();
  return it->second;
}

std::string_view ProfilerRecorder::intern(std::string_view name) {
  if (name.empty()) return {};
  Profiler::Impl& impl = *profiler_.impl_;
  std::lock_guard lock(impl.names_mu);
  auto it = impl.names.find(name);
  if (it == impl.names.end()) it = impl.names.emplace(name).first;
  return *it;
}

void ProfilerRecorder::record(ProfilerTrack* track, const SpanInfo& span) {
  assert(track != nullptr && "ProfilerRecorder::record: null track");
  assert(span.end_ns >= span.start_ns && "ProfilerRecorder::record: span ends before it starts");
  if (span.end_ns < span.start_ns) [[unlikely]] {  // never emit negative durations (Release builds)
    SpanInfo clamped = span;
    clamped.end_ns = clamped.start_ns;
    track->append(clamped);
    return;
  }
  track->append(span);
}

void ProfilerRecorder::counter(Device device, std::string_view name, std::int64_t value) {
  const std::string_view interned = intern(name);
  const std::int64_t now = Profiler::now_ns();
  Profiler::Impl& impl = *profiler_.impl_;
  std::lock_guard lock(impl.samples_mu);
  impl.counters.push_back(CounterSample{device, interned, now, value});
}

void ProfilerRecorder::memory(Device device, std::size_t in_use, const MemoryByRole& by_role) {
  const std::string_view name = intern("memory in use");
  const std::int64_t now = Profiler::now_ns();
  Profiler::Impl& impl = *profiler_.impl_;
  std::lock_guard lock(impl.samples_mu);
  impl.counters.push_back(CounterSample{device, name, now, static_cast<std::int64_t>(in_use), true, by_role});
}

void ProfilerRecorder::record_push(PushRecord push) {
  Profiler::Impl& impl = *profiler_.impl_;
  std::lock_guard lock(impl.samples_mu);
  impl.pushes.push_back(std::move(push));
}

void ProfilerRecorder::record_var_name(std::uint64_t key, std::string_view name) {
  const std::string_view interned = intern(name);
  Profiler::Impl& impl = *profiler_.impl_;
  std::lock_guard lock(impl.samples_mu);
  impl.var_names[key] = interned;
}

}  // namespace detail

std::vector<Span> Profiler::spans() const {
  std::vector<Span> out;
  for (const Track* t : impl_->sorted_tracks()) {
    out.reserve(out.size() + t->size());
    t->for_each([&](const SpanInfo& r) {
      out.push_back(Span{r.name, t->device(), t->index(), r.op_id, r.start_ns, r.end_ns, t->kind(), t->resource(),
                         r.push_ns, r.unblocked_by, r.bytes, r.property});
    });
  }
  // Tracks are visited in (device, index) order and each track in record order,
  // so a stable sort keeps ties deterministic.
  std::stable_sort(out.begin(), out.end(), [](const Span& a, const Span& b) { return a.start_ns < b.start_ns; });
  return out;
}

std::vector<OpStats> Profiler::aggregate() const {
  struct Acc {
    std::uint64_t count = 0;
    std::int64_t total = 0, min = 0, max = 0;
  };
  std::unordered_map<std::string_view, Acc> by_name;
  for (const Track* t : impl_->sorted_tracks()) {
    // The host side of GPU work is its launch: the per-op table counts each op once.
    if (t->kind() == TrackKind::launch) continue;
    t->for_each([&](const SpanInfo& r) {
      std::int64_t d = r.end_ns - r.start_ns;
      Acc& a = by_name[display_name(r.name)];
      if (a.count == 0) a.min = a.max = d;
      else {
        a.min = std::min(a.min, d);
        a.max = std::max(a.max, d);
      }
      ++a.count;
      a.total += d;
    });
  }
  std::vector<OpStats> out;
  out.reserve(by_name.size());
  for (const auto& [name, a] : by_name) {
    OpStats s;
    s.name = std::string(name);
    s.count = a.count;
    s.total_us = static_cast<double>(a.total) / 1000.0;
    s.min_us = static_cast<double>(a.min) / 1000.0;
    s.max_us = static_cast<double>(a.max) / 1000.0;
    s.mean_us = s.total_us / static_cast<double>(a.count);
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const OpStats& a, const OpStats& b) {
    if (a.total_us != b.total_us) return a.total_us > b.total_us;
    return a.name < b.name;
  });
  return out;
}

std::vector<VarStats> Profiler::aggregate_by_variable() const {
  std::unordered_map<std::uint64_t, std::int64_t> op_ns;  // op id -> time of its spans
  for (const Track* t : impl_->sorted_tracks()) {
    if (t->kind() == TrackKind::launch) continue;  // as in aggregate()
    t->for_each([&](const SpanInfo& r) { op_ns[r.op_id] += r.end_ns - r.start_ns; });
  }
  const std::vector<PushRecord> pushes = impl_->labelled_pushes(nullptr);
  std::map<std::string_view, VarStats> by_name;
  std::map<std::string_view, std::int64_t> total_ns;
  for (const PushRecord& p : pushes) {
    auto ns = op_ns.find(p.op_id);
    if (ns == op_ns.end()) continue;  // not run (yet) while recording
    for (const VarUse& v : p.vars) {
      if (!v.write || v.name.empty()) continue;
      VarStats& st = by_name[v.name];
      if (st.writes == 0) st.name = std::string(v.name);
      ++st.writes;
      total_ns[v.name] += ns->second;
      const std::string op(detail::display_name(p.name));
      if (std::find(st.ops.begin(), st.ops.end(), op) == st.ops.end()) st.ops.push_back(op);
    }
  }
  std::vector<VarStats> out;
  for (auto& [name, st] : by_name) {
    st.total_us = static_cast<double>(total_ns[name]) / 1000.0;
    out.push_back(std::move(st));
  }
  std::sort(out.begin(), out.end(), [](const VarStats& a, const VarStats& b) {
    if (a.total_us != b.total_us) return a.total_us > b.total_us;
    return a.name < b.name;
  });
  return out;
}

std::string Profiler::summary_table() const {
  std::vector<OpStats> stats = aggregate();
  std::size_t name_w = 4;
  for (const auto& s : stats) name_w = std::max(name_w, s.name.size());
  std::ostringstream os;
  os << std::left << std::setw(static_cast<int>(name_w)) << "name" << std::right << "  " << std::setw(10) << "count"
     << "  " << std::setw(12) << "total ms" << "  " << std::setw(12) << "mean us" << "  " << std::setw(12) << "min us"
     << "  " << std::setw(12) << "max us" << '\n';
  os << std::string(name_w + 2 + 10 + 4 * (2 + 12), '-') << '\n';
  os << std::fixed;
  for (const auto& s : stats) {
    os << std::left << std::setw(static_cast<int>(name_w)) << s.name << std::right << "  " << std::setw(10) << s.count
       << "  " << std::setw(12) << std::setprecision(3) << s.total_us / 1000.0 << "  " << std::setw(12)
       << std::setprecision(3) << s.mean_us << "  " << std::setw(12) << s.min_us << "  " << std::setw(12) << s.max_us
       << '\n';
  }
  const std::vector<VarStats> vars = aggregate_by_variable();
  const auto with_notes = [&os]() {
    const auto lines = notes();
    if (lines.empty()) return os.str();
    os << "\nnotes:\n";
    for (const auto& line : lines) os << "  " << line.second << '\n';
    return os.str();
  };
  if (vars.empty()) return with_notes();
  std::size_t var_w = 8;
  for (const auto& v : vars) var_w = std::max(var_w, v.name.size());
  os << "\nby variable written (named variables):\n";
  os << std::left << std::setw(static_cast<int>(var_w)) << "variable" << std::right << "  " << std::setw(10)
     << "writes" << "  " << std::setw(12) << "total ms" << "  " << "written by" << '\n';
  os << std::string(var_w + 2 + 10 + 2 + 12 + 2 + 10, '-') << '\n';
  for (const auto& v : vars) {
    std::string ops;
    for (const std::string& op : v.ops) ops += (ops.empty() ? "" : ", ") + op;
    os << std::left << std::setw(static_cast<int>(var_w)) << v.name << std::right << "  " << std::setw(10)
       << v.writes << "  " << std::setw(12) << std::setprecision(3) << v.total_us / 1000.0 << "  " << ops << '\n';
  }
  return with_notes();
}

void Profiler::dump(const std::string& path) const {
  auto fail = [&](const char* what, int err) {
    throw Error("weft::Profiler::dump: cannot " + std::string(what) + " '" + path +
                "': " + (err != 0 ? std::strerror(err) : "unknown error"));
  };
  errno = 0;
  std::ofstream out(path, std::ios::out | std::ios::trunc | std::ios::binary);
  if (!out) fail("open for writing", errno);
  write_trace(out);
  errno = 0;
  out.flush();
  if (!out) fail("write", errno);
  out.close();
  if (!out) fail("write", errno);
}

}  // namespace weft
