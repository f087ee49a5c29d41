// Reading WEFT_* environment variables in devices/: unset or empty means the
// fallback; anything unparsable or out of range is a weft::InvalidArgument
// naming the variable and its value.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "weft/error.h"

namespace weft::gpu::env {

inline const char* get(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

[[noreturn]] inline void bad(const char* name, std::string_view value, const std::string& expected) {
  throw InvalidArgument(std::string("weft: environment variable ") + name + "='" + std::string(value) + "' is not " +
                        expected);
}

inline long long number_or(const char* name, long long fallback, long long min, long long max) {
  const char* text = get(name);
  if (!text) return fallback;
  const std::string_view s(text);
  long long value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < min || value > max)
    bad(name, s, "a number in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  return value;
}

inline double real_or(const char* name, double fallback, double min, double max) {
  const char* text = get(name);
  if (!text) return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(value) || value < min || value > max)
    bad(name, text, "a number in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  return value;
}

// Bytes: "4294967296", "4G", "4GiB", "512M", "512MiB", "64K" (powers of 1024).
inline std::size_t bytes_or(const char* name, std::size_t fallback) {
  const char* text = get(name);
  if (!text) return fallback;
  const std::string_view s(text);
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  std::string_view unit(end, static_cast<std::size_t>(s.data() + s.size() - end));
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  else if (unit == "K" || unit == "KiB") shift = 10;
  else if (unit == "M" || unit == "MiB") shift = 20;
  else if (unit == "G" || unit == "GiB") shift = 30;
  if (ec != std::errc() || shift < 0 || value == 0 || value > (std::uint64_t{1} << (50 - shift)))
    bad(name, s, "a size in bytes (a positive number, optionally with K, M or G; at most 1 PiB)");
  return static_cast<std::size_t>(value << shift);
}

}  // namespace weft::gpu::env
