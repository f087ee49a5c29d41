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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weft/env.h"

namespace weft_test {

inline const std::vector<int>& worker_counts() {
  static const std::vector<int> counts = [] {
    const char* env = weft::env::get("WEFT_TEST_WORKERS");
    if (env == nullptr) return std::vector<int>{1, 2, 4, 8};
    std::vector<int> out;
    const std::string_view s = env;
    std::size_t pos = 0;
    while (pos <= s.size()) {
      const std::size_t comma = std::min(s.find(',', pos), s.size());
      const std::optional<long long> count = weft::env::parse_number(s.substr(pos, comma - pos), 1, 64);
      if (!count) {
        // At static initialization: no one to throw to.
        const std::string message =
            weft::env::malformed_message("WEFT_TEST_WORKERS", s, "a list of worker counts from 1 to 64, such as 2,8");
        std::fprintf(stderr, "%s\n", message.c_str());
        std::exit(2);
      }
      out.push_back(static_cast<int>(*count));
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
