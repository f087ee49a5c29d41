// Profiler::summarize: per-resource busy time and the overlap of compute with
// copies and of devices with each other, from the recorded spans. The rules
// are docs/trace-format.md's; scripts/trace-summary applies the same ones to
// a trace file.
#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "profiler_impl.h"

namespace weft {

namespace {

using Interval = std::pair<std::int64_t, std::int64_t>;

// Sorted, disjoint intervals covering the same time as `v`.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second) out.back().second = std::max(out.back().second, i.second);
    else out.push_back(i);
  }
  return out;
}

std::int64_t length(const std::vector<Interval>& v) {
  std::int64_t sum = 0;
  for (const Interval& i : v) sum += i.second - i.first;
  return sum;
}

// Time covered by both (each merged).
std::int64_t common(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::int64_t sum = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const std::int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) sum += hi - lo;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return sum;
}

double ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }
double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

Overlap overlap(std::string a, std::string b, const std::vector<Interval>& x, const std::vector<Interval>& y) {
  Overlap o{std::move(a), std::move(b)};
  const std::int64_t lx = length(x), ly = length(y), both = common(x, y);
  o.a_ms = ms(lx);
  o.b_ms = ms(ly);
  o.both_ms = ms(both);
  o.efficiency = std::min(lx, ly) > 0 ? static_cast<double>(both) / static_cast<double>(std::min(lx, ly)) : 0.0;
  return o;
}

}  // namespace

ProfileSummary Profiler::summarize() const {
  ProfileSummary out;
  std::int64_t first = 0, last = 0;
  bool any = false;
  struct Group {
    ResourceUsage usage;
    std::int64_t busy_ns = 0;
  };
  std::map<std::pair<Device, std::string>, Group> groups;
  std::vector<Interval> compute, copy;
  std::map<std::string, std::vector<Interval>> by_device;
  for (const Track* t : impl_->sorted_tracks()) {
    Group& g = groups[{t->device(), t->resource()}];
    g.usage.resource = t->resource();
    g.usage.device = t->device();
    g.usage.kind = t->kind();
    ++g.usage.tracks;
    const bool counts = t->kind() != TrackKind::launch;  // launches are the host side of stream spans
    t->for_each([&](const SpanInfo& s) {
      if (!any) first = s.start_ns, last = s.end_ns, any = true;
      first = std::min(first, s.start_ns);
      last = std::max(last, s.end_ns);
      ++g.usage.ops;
      g.busy_ns += s.end_ns - s.start_ns;
      g.usage.bytes += s.bytes;
      if (!counts) return;
      (is_copy(s.property) ? copy : compute).emplace_back(s.start_ns, s.end_ns);
      by_device[t->device().str()].emplace_back(s.start_ns, s.end_ns);
    });
  }
  const std::int64_t window = any ? last - first : 0;
  out.window_ms = ms(window);
  for (auto& [key, g] : groups) {
    g.usage.busy_ms = ms(g.busy_ns);
    g.usage.utilization =
        window > 0 ? static_cast<double>(g.busy_ns) / (static_cast<double>(window) * g.usage.tracks) : 0.0;
    out.resources.push_back(std::move(g.usage));
  }
  out.compute_copy = overlap("compute", "copy", merged(std::move(compute)), merged(std::move(copy)));
  std::vector<std::pair<std::string, std::vector<Interval>>> devices;
  for (auto& [name, v] : by_device) devices.emplace_back(name, merged(std::move(v)));  // by name: a < b
  for (std::size_t i = 0; i < devices.size(); ++i)
    for (std::size_t j = i + 1; j < devices.size(); ++j)
      out.devices.push_back(overlap(devices[i].first, devices[j].first, devices[i].second, devices[j].second));
  {
    std::lock_guard lock(impl_->samples_mu);
    // Per device (by name, as the overlaps), its peak and when it came.
    std::map<std::string, std::pair<MemoryPeak, std::int64_t>> peaks;
    std::int64_t origin = first;  // the window's start; without spans, the first sample's time
    bool sampled = false;
    for (const detail::CounterSample& c : impl_->counters) {
      if (!c.memory) continue;
      if (!any) origin = sampled ? std::min(origin, c.ts_ns) : c.ts_ns;
      sampled = true;
      auto [it, fresh] = peaks.try_emplace(c.device.str());
      auto& [peak, ts] = it->second;
      if (!fresh && static_cast<std::size_t>(c.value) < peak.bytes) continue;
      peak.device = c.device;
      peak.bytes = static_cast<std::size_t>(c.value);
      peak.by_role = c.by_role;
      ts = c.ts_ns;
    }
    for (auto& [name, p] : peaks) {
      p.first.at_ms = ms(std::max<std::int64_t>(0, p.second - origin));
      out.memory.push_back(p.first);
    }
  }
  return out;
}

std::string ProfileSummary::table() const {
  std::size_t w = 8;
  for (const auto& r : resources) w = std::max(w, r.resource.size());
  std::ostringstream os;
  os << std::fixed << std::setprecision(3);
  os << "profiled window " << window_ms << " ms\n";
  os << std::left << std::setw(static_cast<int>(w)) << "resource" << std::right << "  " << std::setw(6) << "kind"
     << "  " << std::setw(6) << "tracks" << "  " << std::setw(9) << "ops" << "  " << std::setw(11) << "busy ms"
     << "  " << std::setw(6) << "util %" << "  " << std::setw(12) << "bytes" << "  " << std::setw(7) << "GB/s" << '\n';
  for (const auto& r : resources) {
    os << std::left << std::setw(static_cast<int>(w)) << r.resource << std::right << "  " << std::setw(6)
       << to_string(r.kind) << "  " << std::setw(6) << r.tracks << "  " << std::setw(9) << r.ops << "  "
       << std::setw(11) << r.busy_ms << "  " << std::setw(6) << std::setprecision(1) << 100.0 * r.utilization
       << std::setprecision(3) << "  " << std::setw(12) << r.bytes << "  " << std::setw(7);
    if (r.bytes > 0 && r.busy_ms > 0) os << static_cast<double>(r.bytes) / (r.busy_ms * 1e6);
    else os << "-";
    os << '\n';
  }
  auto line = [&](const Overlap& o) {
    os << "  " << o.a << " " << o.a_ms << " ms, " << o.b << " " << o.b_ms << " ms, both " << o.both_ms
       << " ms: overlap efficiency " << std::setprecision(2) << o.efficiency << std::setprecision(3) << '\n';
  };
  os << "overlap of compute and copies (union of spans; launch tracks not counted):\n";
  line(compute_copy);
  if (!devices.empty()) os << "overlap between devices:\n";
  for (const auto& o : devices) line(o);
  if (!memory.empty()) os << "memory peaks (allocator bytes in use, MiB) and what held them:\n";
  for (const MemoryPeak& p : memory) {
    os << "  " << p.device.str() << " " << mib(p.bytes) << " at " << p.at_ms << " ms:";
    for (std::size_t k = 0; k < kMemoryRoles; ++k)
      os << (k ? ", " : " ") << to_string(static_cast<MemoryRole>(k)) << " " << mib(p.by_role[k]);
    os << '\n';
  }
  return os.str();
}

std::string ProfileSummary::json() const {
  auto overlap_json = [](const Overlap& o) {
    return nlohmann::json{{"a", o.a},       {"b", o.b},         {"a_ms", o.a_ms},
                          {"b_ms", o.b_ms}, {"both_ms", o.both_ms}, {"efficiency", o.efficiency}};
  };
  nlohmann::json j;
  j["window_ms"] = window_ms;
  j["resources"] = nlohmann::json::array();
  for (const auto& r : resources)
    j["resources"].push_back({{"resource", r.resource},
                              {"device", r.device.str()},
                              {"kind", std::string(to_string(r.kind))},
                              {"tracks", r.tracks},
                              {"ops", r.ops},
                              {"busy_ms", r.busy_ms},
                              {"utilization", r.utilization},
                              {"bytes", r.bytes}});
  j["compute_copy"] = overlap_json(compute_copy);
  j["devices"] = nlohmann::json::array();
  for (const auto& o : devices) j["devices"].push_back(overlap_json(o));
  j["memory"] = nlohmann::json::array();
  for (const MemoryPeak& p : memory) {
    nlohmann::json m{{"device", p.device.str()}, {"peak_bytes", p.bytes}, {"at_ms", p.at_ms}};
    for (std::size_t k = 0; k < kMemoryRoles; ++k) m[std::string(to_string(static_cast<MemoryRole>(k)))] = p.by_role[k];
    j["memory"].push_back(std::move(m));
  }
  return j.dump();
}

}  // namespace weft
