#pragma once

#include <string_view>

namespace weft::demo {
// Runs demo `name` (async, barriers, memory, cpu-gpu, compute-copy,
// multidevice) with its command line; returns the exit status.
int run_named(std::string_view name, int argc, char** argv);
}  // namespace weft::demo
