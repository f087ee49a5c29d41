// Profiler::write_trace: the chrome://tracing / Perfetto JSON of
// docs/trace-format.md, written by hand (a million spans would take a
// nlohmann::json document several times the file's size).
#include <deque>
#include <algorithm>
#include <charconv>
#include <limits>
#include <ostream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "profiler_impl.h"

namespace weft {

namespace {

using detail::display_name;
using detail::process_id;
using detail::thread_id;

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

template <class Int>
void append_int(std::string& out, Int v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;
  out.append(buf, end);
}

void append_double(std::string& out, double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, 3);
  (void)ec;
  out.append(buf, end);
}

struct TrackSpans {
  const Track* track;
  std::int64_t pid, tid;
  std::vector<SpanInfo> spans;  // by start
};

// Where an op's arrows attach: its GPU-side span when it has one, else its
// host span.
struct Anchor {
  std::int64_t pid, tid, start_ns, end_ns;
  std::uint64_t unblocked_by;
  bool device_side;
};

}  // namespace

void Profiler::write_trace(std::ostream& os) const {
  std::vector<TrackSpans> tracks;
  std::int64_t base = std::numeric_limits<std::int64_t>::max();
  std::int64_t first_start = std::numeric_limits<std::int64_t>::max(), last_end = std::numeric_limits<std::int64_t>::min();
  for (const Track* t : impl_->sorted_tracks()) {
    TrackSpans& ts = tracks.emplace_back(TrackSpans{t, process_id(t->device()), thread_id(t->index()), {}});
    ts.spans.reserve(t->size());
    t->for_each([&](const SpanInfo& r) {
      ts.spans.push_back(r);
      first_start = std::min(first_start, r.start_ns);
      last_end = std::max(last_end, r.end_ns);
      if (r.push_ns >= 0) base = std::min(base, r.push_ns);
    });
    std::stable_sort(ts.spans.begin(), ts.spans.end(),
                     [](const SpanInfo& a, const SpanInfo& b) { return a.start_ns < b.start_ns; });
  }
  std::unordered_set<std::int64_t> named;  // processes named for counters alone
  std::vector<detail::CounterSample> counters;
  {
    std::lock_guard lock(impl_->samples_mu);
    counters = impl_->counters;
  }
  base = std::min(base, first_start);
  for (const auto& c : counters) base = std::min(base, c.ts_ns);
  if (base == std::numeric_limits<std::int64_t>::max()) base = 0;
  if (first_start > last_end) first_start = last_end = base;

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
  auto pid_tid_ts = [&](std::int64_t pid, std::int64_t tid, std::int64_t ts_ns) {
    buf += R"(,"pid":)";
    append_int(buf, pid);
    buf += R"(,"tid":)";
    append_int(buf, tid);
    buf += R"(,"ts":)";
    append_us(buf, ts_ns - base);
  };

  // A device's trace process: its name and its place in the list.
  auto name_process = [&](Device device) {
    const std::int64_t pid = process_id(device);
    begin_event();
    buf += R"({"ph":"M","name":"process_name","pid":)";
    append_int(buf, pid);
    buf += R"(,"args":{"name":)";
    buf += json_string(device.str());
    buf += "}}";
    begin_event();
    buf += R"({"ph":"M","name":"process_sort_index","pid":)";
    append_int(buf, pid);
    buf += R"(,"args":{"sort_index":)";
    append_int(buf, pid);
    buf += "}}";
  };

  // The "weft" object: what each track is (the summary groups by it).
  buf += R"({"displayTimeUnit":"ns","weft":{"schema":2,"window_us":[)";
  append_us(buf, first_start - base);
  buf += ',';
  append_us(buf, last_end - base);
  buf += R"(],"tracks":[)";
  for (std::size_t i = 0; i < tracks.size(); ++i) {
    const Track* t = tracks[i].track;
    buf += i ? ",\n" : "\n";
    buf += R"({"pid":)";
    append_int(buf, tracks[i].pid);
    buf += R"(,"tid":)";
    append_int(buf, tracks[i].tid);
    buf += R"(,"device":)";
    buf += json_string(t->device().str());
    buf += R"(,"label":)";
    buf += json_string(t->label());
    buf += R"(,"kind":")";
    buf += to_string(t->kind());
    buf += R"(","resource":)";
    buf += json_string(t->resource());
    buf += '}';
  }
  buf += R"(]},"traceEvents":[)";

  // Metadata: one process per device, one thread per track.
  bool have_device = false;
  Device last_device;
  for (const TrackSpans& ts : tracks) {
    const Track* t = ts.track;
    if (!have_device || t->device() != last_device) {
      have_device = true;
      last_device = t->device();
      name_process(t->device());
    }
    begin_event();
    buf += R"({"ph":"M","name":"thread_name","pid":)";
    append_int(buf, ts.pid);
    buf += R"(,"tid":)";
    append_int(buf, ts.tid);
    buf += R"(,"args":{"name":)";
    buf += json_string(t->label());
    buf += "}}";
    begin_event();
    buf += R"({"ph":"M","name":"thread_sort_index","pid":)";
    append_int(buf, ts.pid);
    buf += R"(,"tid":)";
    append_int(buf, ts.tid);
    buf += R"(,"args":{"sort_index":)";
    append_int(buf, ts.tid);
    buf += "}}";
    flush_if_big();
  }

  // The variables each op read and wrote, by name (recorded at push).
  std::deque<std::string> labels;
  const std::vector<PushRecord> pushes = impl_->labelled_pushes(&labels);
  std::unordered_map<std::uint64_t, const PushRecord*> push_of;
  push_of.reserve(pushes.size());
  for (const PushRecord& p : pushes) push_of.emplace(p.op_id, &p);
  auto append_vars = [&](const PushRecord& p, bool write) {
    buf += write ? R"(,"writes":[)" : R"(,"reads":[)";
    bool first = true;
    for (const VarUse& v : p.vars) {
      if (v.write != write) continue;
      if (!first) buf += ',';
      first = false;
      buf += esc(v.name);
    }
    buf += ']';
  };

  // One complete event per span; remember where each op's arrows attach.
  std::unordered_map<std::uint64_t, Anchor> anchors;
  for (const TrackSpans& ts : tracks) {
    const bool device_side = ts.track->kind() == TrackKind::stream;
    for (const SpanInfo& r : ts.spans) {
      begin_event();
      buf += R"({"ph":"X","name":)";
      buf += esc(r.name);
      buf += is_copy(r.property) ? R"(,"cat":"copy")" : R"(,"cat":"compute")";
      pid_tid_ts(ts.pid, ts.tid, r.start_ns);
      buf += R"(,"dur":)";
      append_us(buf, r.end_ns - r.start_ns);
      buf += R"(,"args":{"op_id":)";
      append_int(buf, r.op_id);
      buf += R"(,"property":")";
      buf += to_string(r.property);
      buf += '"';
      if (auto p = push_of.find(r.op_id); p != push_of.end()) {
        append_vars(*p->second, false);
        append_vars(*p->second, true);
        if (!p->second->shape.empty()) {
          buf += R"(,"shape":)";
          buf += esc(p->second->shape);
        }
      }
      if (r.bytes > 0) {
        buf += R"(,"bytes":)";
        append_int(buf, r.bytes);
        const std::int64_t dur = r.end_ns - r.start_ns;
        buf += R"(,"GB_per_s":)";
        append_double(buf, dur > 0 ? static_cast<double>(r.bytes) / static_cast<double>(dur) : 0.0);
      }
      buf += "}}";
      flush_if_big();
      auto [it, inserted] =
          anchors.try_emplace(r.op_id, Anchor{ts.pid, ts.tid, r.start_ns, r.end_ns, r.unblocked_by, device_side});
      if (!inserted && device_side && !it->second.device_side) {
        const std::uint64_t unblocked_by = it->second.unblocked_by;  // recorded on the host side
        it->second = Anchor{ts.pid, ts.tid, r.start_ns, r.end_ns, unblocked_by ? unblocked_by : r.unblocked_by, true};
      } else if (!inserted && !device_side && it->second.device_side && it->second.unblocked_by == 0) {
        it->second.unblocked_by = r.unblocked_by;
      }
    }
  }

  // Flow arrows: from the end of the op that made another ready to its start.
  // Ids are the unblocked op's id (an op is unblocked once).
  for (const auto& [op_id, to] : anchors) {
    if (to.unblocked_by == 0) continue;
    auto from = anchors.find(to.unblocked_by);
    if (from == anchors.end()) continue;  // the unblocking op ran before profiling started
    const Anchor& a = from->second;
    begin_event();
    buf += R"({"ph":"s","name":"unblocks","cat":"dependency","id":)";
    append_int(buf, op_id);
    pid_tid_ts(a.pid, a.tid, std::max(a.start_ns, a.end_ns - 1));
    buf += '}';
    begin_event();
    buf += R"({"ph":"f","bp":"e","name":"unblocks","cat":"dependency","id":)";
    append_int(buf, op_id);
    pid_tid_ts(to.pid, to.tid, to.start_ns);
    buf += '}';
    flush_if_big();
  }

  // Ops in flight (pushed, not yet finished in the engine's sense), from the
  // host spans' push and end times: one sample per change.
  std::vector<std::pair<std::int64_t, int>> steps;
  for (const TrackSpans& ts : tracks) {
    if (ts.track->kind() == TrackKind::stream) continue;
    for (const SpanInfo& r : ts.spans) {
      if (r.push_ns < 0) continue;
      steps.emplace_back(r.push_ns, +1);
      steps.emplace_back(r.end_ns, -1);
    }
  }
  std::sort(steps.begin(), steps.end());
  const std::int64_t counter_pid = tracks.empty() ? 1 : tracks.front().pid;
  std::int64_t in_flight = 0;
  for (std::size_t i = 0; i < steps.size();) {
    const std::int64_t ts = steps[i].first;
    for (; i < steps.size() && steps[i].first == ts; ++i) in_flight += steps[i].second;
    begin_event();
    buf += R"({"ph":"C","name":"ops in flight","pid":)";
    append_int(buf, counter_pid);
    buf += R"(,"ts":)";
    append_us(buf, ts - base);
    buf += R"(,"args":{"ops":)";
    append_int(buf, in_flight);
    buf += "}}";
    flush_if_big();
  }

  // Counters the engine sampled (allocator memory per device); a device
  // with no track (cpu_pinned) gets its process named here.
  for (const auto& c : counters) {
    if (std::any_of(tracks.begin(), tracks.end(), [&](const TrackSpans& t) { return t.track->device() == c.device; }))
      continue;
    if (named.insert(process_id(c.device)).second) name_process(c.device);
  }
  for (const auto& c : counters) {
    begin_event();
    buf += R"({"ph":"C","name":)";
    buf += esc(c.name);
    buf += R"(,"pid":)";
    append_int(buf, process_id(c.device));
    buf += R"(,"ts":)";
    append_us(buf, c.ts_ns - base);
    buf += R"(,"args":{"bytes":)";
    append_int(buf, c.value);
    buf += "}}";
    if (c.memory) {  // the same sample split by role: stacked in one track
      begin_event();
      buf += R"({"ph":"C","name":"memory by role","pid":)";
      append_int(buf, process_id(c.device));
      buf += R"(,"ts":)";
      append_us(buf, c.ts_ns - base);
      buf += R"(,"args":{)";
      for (std::size_t k = 0; k < kMemoryRoles; ++k) {
        if (k) buf += ',';
        buf += esc(to_string(static_cast<MemoryRole>(k)));
        buf += ':';
        append_int(buf, static_cast<std::int64_t>(c.by_role[k]));
      }
      buf += "}}";
    }
    flush_if_big();
  }
  buf += "\n]}\n";
  os.write(buf.data(), static_cast<std::streamsize>(buf.size()));
}

}  // namespace weft
