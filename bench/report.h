// What the bench prints: one JSON object per line per (engine, shape, body),
// and a human-readable table of the same numbers.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "measure.h"

namespace weft_bench {

struct Result {
  std::string engine, shape, body;
  std::size_t ops = 0;
  int reps = 0;
  Summary ns_per_op;
  double speedup_vs_sequential = 0;
  double core_round_trip_ns = 0;  // Calibration::core_round_trip_ns of the run
  int noise_threads = 0;          // --noise: busy threads beside the measurement
};

void print_json_line(std::FILE* out, const Result& r);

// Rows shape x body, one column per engine: median ns/op and speedup.
void print_table(std::FILE* out, const std::vector<Result>& results, const std::vector<std::string>& engines);

}  // namespace weft_bench
