// The worker counts every engine scenario runs at.
//
// Each scenario runs on the naive engine and on the threaded one at 1, 2, 4
// and 8 workers per device (per compute stream on GPUs). WEFT_TEST_WORKERS
// ("2,8") narrows the threaded list: the sanitizer test presets take two
// counts each (ASan 1 and 4, TSan 2 and 8, CMakePresets.json) to stay inside
// CI's time; Release runs all four. A value that is not a list of counts from
// 1 to 64 stops the binary with a message naming it.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace weft_test {

inline const std::vector<int>& worker_counts() {
  static const std::vector<int> counts = [] {
    const char* env = std::getenv("WEFT_TEST_WORKERS");
    if (env == nullptr || *env == '\0') return std::vector<int>{1, 2, 4, 8};
    std::vector<int> out;
    const std::string s = env;
    std::size_t pos = 0;
    while (pos <= s.size()) {
      const std::size_t comma = std::min(s.find(',', pos), s.size());
      const std::string item = s.substr(pos, comma - pos);
      char* end = nullptr;
      const long v = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || v < 1 || v > 64) {
        std::fprintf(stderr, "WEFT_TEST_WORKERS=\"%s\": \"%s\" is not a worker count from 1 to 64\n", env,
                     item.c_str());
        std::exit(2);
      }
      out.push_back(static_cast<int>(v));
      pos = comma + 1;
    }
    return out;
  }();
  return counts;
}

// The counts of worker_counts() of at least `min_workers`; when it has none,
// the smallest of 1, 2, 4, 8 that is, so a scenario that needs many workers
// still runs once.
inline std::vector<int> worker_counts_from(int min_workers) {
  std::vector<int> out;
  for (int w : worker_counts())
    if (w >= min_workers) out.push_back(w);
  if (out.empty())
    for (int w : {1, 2, 4, 8})
      if (w >= min_workers) return {w};
  return out;
}

}  // namespace weft_test
