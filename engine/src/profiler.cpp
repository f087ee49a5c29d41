// weft::Profiler — see weft/profiler.h for the threading contract.
//
// Each Track is a single-writer chain of fixed-size chunks. The owner thread
// fills a slot, then publishes it by bumping `count_` with a release store;
// a new chunk is linked (release) before the first span in it is published.
// Readers load `count_` (acquire) and walk the chain, so they see a prefix of
// whole spans even if a writer is still appending; spans never move.
#include "weft/profiler.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <mutex>
#include <ostream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

#include "weft/error.h"

namespace weft {

namespace {

struct Record {
  std::string_view name;
  std::uint64_t op_id;
  std::int64_t start_ns;
  std::int64_t end_ns;
};

constexpr std::size_t kChunkSpans = 1024;  // ~40 KiB per chunk

struct Chunk {
  std::array<Record, kChunkSpans> spans;
  std::atomic<Chunk*> next{nullptr};
};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

}  // namespace

class Profiler::Track {
 public:
  Track(Device device, int index, std::string label) : device_(device), index_(index), label_(std::move(label)) {}
  ~Track() { free_chunks(); }
  Track(const Track&) = delete;
  Track& operator=(const Track&) = delete;

  Device device() const noexcept { return device_; }
  int index() const noexcept { return index_; }
  const std::string& label() const noexcept { return label_; }

  // Owner thread only.
  void append(std::string_view name, std::uint64_t op_id, std::int64_t start_ns, std::int64_t end_ns) {
    if (pos_ == kChunkSpans) [[unlikely]]
      grow();
    cur_->spans[pos_++] = Record{name, op_id, start_ns, end_ns};
    count_.store(count_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // Any thread: calls fn(const Record&) for every published span, in record order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    std::size_t n = count_.load(std::memory_order_acquire);
    const Chunk* c = head_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < n && c != nullptr; c = c->next.load(std::memory_order_acquire)) {
      std::size_t in_chunk = std::min(kChunkSpans, n - i);
      for (std::size_t k = 0; k < in_chunk; ++k) fn(c->spans[k]);
      i += in_chunk;
    }
  }

  std::size_t size() const noexcept { return count_.load(std::memory_order_acquire); }

  // Writers must be quiescent.
  void clear() noexcept {
    free_chunks();
    count_.store(0, std::memory_order_release);
  }

 private:
  void grow() {
    auto* c = new Chunk;
    if (cur_ == nullptr) head_.store(c, std::memory_order_release);
    else cur_->next.store(c, std::memory_order_release);
    cur_ = c;
    pos_ = 0;
  }

  void free_chunks() noexcept {
    Chunk* c = head_.exchange(nullptr, std::memory_order_acq_rel);
    while (c != nullptr) {
      Chunk* next = c->next.load(std::memory_order_relaxed);
      delete c;
      c = next;
    }
    cur_ = nullptr;
    pos_ = kChunkSpans;
  }

  const Device device_;
  const int index_;
  const std::string label_;
  std::atomic<Chunk*> head_{nullptr};
  std::atomic<std::size_t> count_{0};
  // Writer-side state (owner thread, or clear() while quiescent).
  Chunk* cur_ = nullptr;
  std::size_t pos_ = kChunkSpans;
};

struct Profiler::Impl {
  mutable std::mutex tracks_mu;
  std::vector<std::unique_ptr<Track>> tracks;  // creation order; never removed
  std::map<std::pair<Device, int>, Track*> by_key;

  std::mutex names_mu;
  std::unordered_set<std::string, StringHash, std::equal_to<>> names;  // node-based: views stay valid

  // Tracks ordered by (device, index): a snapshot safe to read without the lock
  // (tracks live as long as the profiler).
  std::vector<const Track*> sorted_tracks() const {
    std::lock_guard lock(tracks_mu);
    std::vector<const Track*> out;
    out.reserve(by_key.size());
    for (const auto& [key, t] : by_key) out.push_back(t);
    return out;
  }
};

namespace {

std::int64_t process_id(Device d) { return 1 + 100000 * static_cast<std::int64_t>(d.kind()) + d.index(); }
std::int64_t thread_id(int index) { return static_cast<std::int64_t>(index) + 1; }

// JSON string literal (with quotes); invalid UTF-8 is replaced by U+FFFD rather than throwing.
std::string json_string(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Nanoseconds as microseconds with exactly 3 decimals, from integers (no rounding noise).
void append_us(std::string& out, std::int64_t ns) {
  if (ns < 0) {
    out += '-';
    // -INT64_MIN overflows; clamp (never reached for real clocks).
    ns = ns == std::numeric_limits<std::int64_t>::min() ? std::numeric_limits<std::int64_t>::max() : -ns;
  }
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, ns / 1000);
  (void)ec;
  out.append(buf, end);
  auto frac = static_cast<int>(ns % 1000);
  out += '.';
  out += static_cast<char>('0' + frac / 100);
  out += static_cast<char>('0' + frac / 10 % 10);
  out += static_cast<char>('0' + frac % 10);
}

void append_int(std::string& out, std::int64_t v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, end);
}

void append_uint(std::string& out, std::uint64_t v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, end);
}

std::string_view display_name(std::string_view name) { return name.empty() ? std::string_view("(unnamed)") : name; }

}  // namespace

Profiler::Profiler() : impl_(std::make_unique<Impl>()) {}
Profiler::~Profiler() = default;

void Profiler::start() { running_.store(true, std::memory_order_relaxed); }
void Profiler::stop() { running_.store(false, std::memory_order_relaxed); }

void Profiler::clear() {
  std::lock_guard lock(impl_->tracks_mu);
  for (auto& t : impl_->tracks) t->clear();
}

Profiler::Track* Profiler::track(Device device, int index, std::string label) {
  if (index < 0) throw Error("weft::Profiler::track: negative track index " + std::to_string(index) + " for " + device.str());
  std::lock_guard lock(impl_->tracks_mu);
  auto [it, inserted] = impl_->by_key.try_emplace({device, index}, nullptr);
  if (!inserted) return it->second;  // the first label wins
  try {
    if (label.empty()) label = device.str() + " worker " + std::to_string(index);
    impl_->tracks.push_back(std::make_unique<Track>(device, index, std::move(label)));
  } catch (...) {
    impl_->by_key.erase(it);
    throw;
  }
  it->second = impl_->tracks.back().get();
  return it->second;
}

std::string_view Profiler::intern(std::string_view name) {
  if (name.empty()) return {};
  std::lock_guard lock(impl_->names_mu);
  auto it = impl_->names.find(name);
  if (it == impl_->names.end()) it = impl_->names.emplace(name).first;
  return *it;
}

std::int64_t Profiler::now_ns() noexcept {
  using clock = std::chrono::steady_clock;
  static const clock::time_point epoch = clock::now();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - epoch).count();
}

void Profiler::record(Track* track, std::string_view interned_name, std::uint64_t op_id, std::int64_t start_ns,
                      std::int64_t end_ns) {
  assert(track != nullptr && "weft::Profiler::record: null track");
  assert(end_ns >= start_ns && "weft::Profiler::record: span ends before it starts");
  if (end_ns < start_ns) [[unlikely]]
    end_ns = start_ns;  // never emit negative durations (Release builds)
  track->append(interned_name, op_id, start_ns, end_ns);
}

std::vector<Span> Profiler::spans() const {
  std::vector<Span> out;
  for (const Track* t : impl_->sorted_tracks()) {
    out.reserve(out.size() + t->size());
    t->for_each([&](const Record& r) {
      out.push_back(Span{r.name, t->device(), t->index(), r.op_id, r.start_ns, r.end_ns});
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
    t->for_each([&](const Record& r) {
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
  return os.str();
}

void Profiler::write_trace(std::ostream& os) const {
  std::vector<const Track*> tracks = impl_->sorted_tracks();

  // Snapshot every track once (a writer may still be appending; we use a prefix).
  std::vector<std::vector<Record>> recs(tracks.size());
  std::int64_t base = std::numeric_limits<std::int64_t>::max();
  for (std::size_t i = 0; i < tracks.size(); ++i) {
    recs[i].reserve(tracks[i]->size());
    tracks[i]->for_each([&](const Record& r) {
      recs[i].push_back(r);
      base = std::min(base, r.start_ns);
    });
    std::stable_sort(recs[i].begin(), recs[i].end(),
                     [](const Record& a, const Record& b) { return a.start_ns < b.start_ns; });
  }
  if (base == std::numeric_limits<std::int64_t>::max()) base = 0;

  std::unordered_map<std::string_view, std::string> escaped;  // per distinct name
  auto esc = [&](std::string_view name) -> const std::string& {
    auto it = escaped.find(name);
    if (it == escaped.end()) it = escaped.emplace(name, json_string(display_name(name))).first;
    return it->second;
  };

  std::string buf;
  buf.reserve(1 << 16);
  bool first = true;
  auto flush_if_big = [&] {
    if (buf.size() >= (1 << 16) - 512) {
      os.write(buf.data(), static_cast<std::streamsize>(buf.size()));
      buf.clear();
    }
  };
  auto begin_event = [&] {
    buf += first ? "\n" : ",\n";
    first = false;
  };

  buf += R"({"displayTimeUnit":"ns","traceEvents":[)";

  // Metadata: one process per device, one thread per track.
  bool have_device = false;
  Device last_device;
  for (const Track* t : tracks) {
    std::int64_t pid = process_id(t->device());
    if (!have_device || t->device() != last_device) {
      have_device = true;
      last_device = t->device();
      begin_event();
      buf += R"({"ph":"M","name":"process_name","pid":)";
      append_int(buf, pid);
      buf += R"(,"args":{"name":)";
      buf += json_string(t->device().str());
      buf += "}}";
      begin_event();
      buf += R"({"ph":"M","name":"process_sort_index","pid":)";
      append_int(buf, pid);
      buf += R"(,"args":{"sort_index":)";
      append_int(buf, pid);
      buf += "}}";
    }
    std::int64_t tid = thread_id(t->index());
    begin_event();
    buf += R"({"ph":"M","name":"thread_name","pid":)";
    append_int(buf, pid);
    buf += R"(,"tid":)";
    append_int(buf, tid);
    buf += R"(,"args":{"name":)";
    buf += json_string(t->label());
    buf += "}}";
    begin_event();
    buf += R"({"ph":"M","name":"thread_sort_index","pid":)";
    append_int(buf, pid);
    buf += R"(,"tid":)";
    append_int(buf, tid);
    buf += R"(,"args":{"sort_index":)";
    append_int(buf, tid);
    buf += "}}";
    flush_if_big();
  }

  // One complete event per span.
  for (std::size_t i = 0; i < tracks.size(); ++i) {
    std::int64_t pid = process_id(tracks[i]->device());
    std::int64_t tid = thread_id(tracks[i]->index());
    for (const Record& r : recs[i]) {
      begin_event();
      buf += R"({"ph":"X","name":)";
      buf += esc(r.name);
      buf += R"(,"cat":"op","pid":)";
      append_int(buf, pid);
      buf += R"(,"tid":)";
      append_int(buf, tid);
      buf += R"(,"ts":)";
      append_us(buf, r.start_ns - base);
      buf += R"(,"dur":)";
      append_us(buf, r.end_ns - r.start_ns);
      buf += R"(,"args":{"op_id":)";
      append_uint(buf, r.op_id);
      buf += "}}";
      flush_if_big();
    }
  }
  buf += "\n]}\n";
  os.write(buf.data(), static_cast<std::streamsize>(buf.size()));
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
