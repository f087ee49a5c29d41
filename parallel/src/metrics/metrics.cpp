// Figures from a profiler's trace (weft/parallel/metrics.h).
#include "weft/parallel/metrics.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "weft/error.h"
#include "weft/parallel/pipeline.h"

namespace weft::parallel {

namespace {

using Interval = std::pair<std::int64_t, std::int64_t>;

// How much of `comm`'s union `other`'s union covers.
CommOverlap covered(std::vector<Interval> comm, std::vector<Interval> other) {
  auto merge = [](std::vector<Interval>& v) {
    std::sort(v.begin(), v.end());
    std::vector<Interval> out;
    for (const Interval& i : v) {
      if (!out.empty() && i.first <= out.back().second)
        out.back().second = std::max(out.back().second, i.second);
      else
        out.push_back(i);
    }
    v = std::move(out);
  };
  merge(comm);
  merge(other);
  std::int64_t comm_ns = 0, both_ns = 0;
  std::size_t j = 0;
  for (const Interval& c : comm) {
    comm_ns += c.second - c.first;
    while (j < other.size() && other[j].second <= c.first) ++j;
    for (std::size_t k = j; k < other.size() && other[k].first < c.second; ++k)
      both_ns += std::min(c.second, other[k].second) - std::max(c.first, other[k].first);
  }
  CommOverlap out;
  out.comm_ms = static_cast<double>(comm_ns) / 1e6;
  out.hidden_ms = static_cast<double>(both_ns) / 1e6;
  out.fraction = comm_ns > 0 ? static_cast<double>(both_ns) / static_cast<double>(comm_ns) : 0.0;
  return out;
}

}  // namespace

CommOverlap comm_overlap(const std::vector<Span>& spans, std::string_view marker) {
  std::vector<Interval> comm, other;
  for (const Span& s : spans) {
    if (s.kind == TrackKind::launch || s.end_ns <= s.start_ns) continue;
    (s.name.find(marker) != std::string_view::npos ? comm : other).emplace_back(s.start_ns, s.end_ns);
  }
  return covered(std::move(comm), std::move(other));
}

CommOverlap gpu_overlap(const std::vector<Span>& spans, std::string_view marker) {
  std::vector<Interval> host, gpu;
  for (const Span& s : spans) {
    if (s.end_ns <= s.start_ns) continue;
    if (s.kind == TrackKind::stream) gpu.emplace_back(s.start_ns, s.end_ns);
    else if (s.kind != TrackKind::launch && s.name.find(marker) != std::string_view::npos)
      host.emplace_back(s.start_ns, s.end_ns);
  }
  return covered(std::move(host), std::move(gpu));
}

std::vector<double> measured_bubble(const std::vector<Span>& spans, int stages) {
  using Interval = std::pair<std::int64_t, std::int64_t>;
  std::vector<std::vector<Interval>> busy(static_cast<std::size_t>(std::max(stages, 0)));
  std::int64_t lo = 0, hi = 0;
  bool any = false;
  for (const Span& s : spans) {
    if (s.kind == TrackKind::launch || s.end_ns <= s.start_ns || s.property != OpProperty::normal) continue;
    for (int k = 0; k < stages; ++k) {
      if (s.name.find(Pipeline::span_marker(k)) == std::string_view::npos) continue;
      busy[static_cast<std::size_t>(k)].emplace_back(s.start_ns, s.end_ns);
      lo = any ? std::min(lo, s.start_ns) : s.start_ns;
      hi = any ? std::max(hi, s.end_ns) : s.end_ns;
      any = true;
    }
  }
  std::vector<double> out;
  for (std::vector<Interval>& v : busy) {
    std::sort(v.begin(), v.end());
    std::int64_t covered = 0, end = lo;
    for (const Interval& i : v) {
      const std::int64_t b = std::max(i.first, end);
      if (i.second > b) covered += i.second - b;
      end = std::max(end, i.second);
    }
    out.push_back(hi > lo ? 1.0 - static_cast<double>(covered) / static_cast<double>(hi - lo) : 0.0);
  }
  return out;
}

double predicted_bubble(int stages, int micro_batches) noexcept {
  return stages < 1 || micro_batches < 1 ? 0.0
                                         : static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

double predicted_bubble(std::string_view schedule, int stages, int micro_batches, int virtual_stages) {
  const std::string name(schedule);
  if (stages < 1 || micro_batches < 1 || virtual_stages < 1)
    throw InvalidArgument("predicted_bubble: '" + name + "' with " + std::to_string(stages) + " stages, " +
                          std::to_string(micro_batches) + " micro-batches and " + std::to_string(virtual_stages) +
                          " virtual stages (each must be at least 1)");
  const bool interleaved = name == "interleaved-1f1b";
  if (!interleaved && name != "gpipe" && name != "1f1b" && name != "one_f_one_b" && name != "zb-h1")
    throw InvalidArgument("predicted_bubble: unknown schedule '" + name +
                          "' (known: gpipe, 1f1b, one_f_one_b, zb-h1, interleaved-1f1b)");
  if (!interleaved && virtual_stages != 1)
    throw InvalidArgument("predicted_bubble: '" + name + "' runs one model chunk per stage, not " +
                          std::to_string(virtual_stages) + " virtual stages");
  const double k = stages, m = micro_batches, v = virtual_stages;
  if (name == "zb-h1") return (k - 1) / (3 * m + k - 1);
  if (interleaved) return (k - 1) / (v * m + k - 1);
  return (k - 1) / (m + k - 1);  // gpipe, 1f1b
}

}  // namespace weft::parallel
