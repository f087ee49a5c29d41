#include "report.h"

#include <algorithm>
#include <string>

namespace weft_bench {

void print_json_line(std::FILE* out, const Result& r) {
  // Names come from fixed lists (no quoting needed); %.6g keeps sub-ns
  // medians of the empty body readable without drowning the µs ones.
  std::fprintf(out,
               "{\"engine\":\"%s\",\"shape\":\"%s\",\"body\":\"%s\",\"ns_per_op\":%.6g,\"min\":%.6g,\"max\":%.6g,"
               "\"speedup_vs_sequential\":%.4g,\"ops\":%zu,\"reps\":%d,\"core_round_trip_ns\":%.4g%s}\n",
               r.engine.c_str(), r.shape.c_str(), r.body.c_str(), r.ns_per_op.median, r.ns_per_op.min,
               r.ns_per_op.max, r.speedup_vs_sequential, r.ops, r.reps, r.core_round_trip_ns,
               r.noise_threads > 0 ? (",\"noise_threads\":" + std::to_string(r.noise_threads)).c_str() : "");
  std::fflush(out);
}

void print_table(std::FILE* out, const std::vector<Result>& results, const std::vector<std::string>& engines) {
  std::fprintf(out,
               "\nns/op (median), its spread over the repetitions (half of max - min, in %% of the median) and "
               "speedup vs sequential\n");
  std::fprintf(out, "%-12s %-6s %9s", "shape", "body", "ops");
  for (const std::string& e : engines) std::fprintf(out, " %26s", e.c_str());
  std::fprintf(out, "\n");
  // Rows in the order the results were measured.
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Result& r : results)
    if (std::find(rows.begin(), rows.end(), std::pair{r.shape, r.body}) == rows.end()) rows.emplace_back(r.shape, r.body);
  for (const auto& [shape, body] : rows) {
    std::size_t ops = 0;
    for (const Result& r : results)
      if (r.shape == shape && r.body == body) ops = r.ops;
    std::fprintf(out, "%-12s %-6s %9zu", shape.c_str(), body.c_str(), ops);
    for (const std::string& e : engines) {
      const auto it = std::find_if(results.begin(), results.end(), [&](const Result& r) {
        return r.engine == e && r.shape == shape && r.body == body;
      });
      if (it == results.end()) {
        std::fprintf(out, " %26s", "-");
      } else {
        const double median = it->ns_per_op.median;
        const double spread = median > 0 ? 50.0 * (it->ns_per_op.max - it->ns_per_op.min) / median : 0.0;
        char cell[64];
        std::snprintf(cell, sizeof cell, "%.1f +-%.0f%% (%.2fx)", median, spread, it->speedup_vs_sequential);
        std::fprintf(out, " %26s", cell);
      }
    }
    std::fprintf(out, "\n");
  }
}

}  // namespace weft_bench
