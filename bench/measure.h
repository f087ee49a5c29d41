// Timing and the summary statistics the bench reports.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace weft_bench {

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

struct Summary {
  double median = 0, min = 0, max = 0;
};

// The median rather than the mean: a 2-core machine with other load gives
// occasional outliers that would drag a mean around.
inline Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  s.min = v.front();
  s.max = v.back();
  return s;
}

}  // namespace weft_bench
