// The bench's command line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shapes.h"

namespace weft_bench {

struct Options {
  bool json_only = false;
  bool quick = false;
  bool smoke = false;  // tiny sizes, one repetition: the test suite's correctness run
  int reps = 0;                          // 0: 5, or 3 with --quick
  int noise_threads = 0;                 // busy threads beside every measurement (--noise)
  std::vector<std::string> bodies;       // empty: all
  std::vector<ShapeKind> shapes;         // empty: all
  std::vector<std::string> engines;      // empty: all available
};

// The engines this build can run, in the order they are run and printed.
std::vector<std::string> available_engines();

// Parses argv; prints usage and exits 0 for --help, prints the problem and
// exits 2 for anything it does not understand.
Options parse_options(int argc, char** argv);

}  // namespace weft_bench
