// Reading WEFT_* environment variables: the one reader every layer (and the
// tests) uses. Internal to Weft, never installed.
//
// Unset or empty means the fallback. A value that is malformed or out of
// range is a weft::InvalidArgument with one message for every variable,
// naming it, its value and what it takes:
//   weft: environment variable WEFT_SIM_GPUS='lots' is not a number in [1, 64]
// Numbers are whole (digits, an optional leading '-'); reals are strtod's;
// sizes take K, M or G; switches are 1 or 0; text (paths) is taken as is.
#pragma once

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "weft/error.h"

namespace weft::env {

// The variable's value; null when it is unset or empty.
inline const char* get(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

// The one message for a malformed value: `expected` says what the variable
// takes ("a number in [1, 64]").
inline std::string malformed_message(std::string_view name, std::string_view value, std::string_view expected) {
  return "weft: environment variable " + std::string(name) + "='" + std::string(value) + "' is not " +
         std::string(expected);
}

[[noreturn]] inline void malformed(std::string_view name, std::string_view value, std::string_view expected) {
  throw InvalidArgument(malformed_message(name, value, expected));
}

// A whole number in [min, max], or nothing.
inline std::optional<long long> parse_number(std::string_view text, long long min, long long max) {
  long long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) return std::nullopt;
  return value;
}

// "a number in [min, max]"
inline std::string number_range(long long min, long long max) {
  return "a number in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

// A whole number in [min, max]; `expected` replaces "a number in [min, max]"
// in the message where the range alone would not say what the value means.
inline long long number_or(const char* name, long long fallback, long long min, long long max,
                           std::string_view expected = {}) {
  const char* text = get(name);
  if (!text) return fallback;
  if (const std::optional<long long> value = parse_number(text, min, max)) return *value;
  malformed(name, text, expected.empty() ? number_range(min, max) : std::string(expected));
}

// A real number (strtod: finite, in range) that `accept` takes.
template <class Accept>
double real_if(const char* name, double fallback, Accept accept, std::string_view expected) {
  const char* text = get(name);
  if (!text) return fallback;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !std::isfinite(value) || !accept(value))
    malformed(name, text, expected);
  return value;
}

// A real number in [min, max].
inline double real_or(const char* name, double fallback, double min, double max) {
  char range[80];
  std::snprintf(range, sizeof range, "a number in [%g, %g]", min, max);
  return real_if(name, fallback, [&](double v) { return v >= min && v <= max; }, range);
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
    malformed(name, s, "a size in bytes (a positive number, optionally with K, M or G; at most 1 PiB)");
  return static_cast<std::size_t>(value << shift);
}

// A switch: "1" or "0". `on_means` and `off_means` say what each does.
inline bool flag_or(const char* name, bool fallback, std::string_view on_means, std::string_view off_means) {
  const char* text = get(name);
  if (!text) return fallback;
  const std::string_view value(text);
  if (value == "1") return true;
  if (value == "0") return false;
  malformed(name, value,
            "1 (" + std::string(on_means) + (fallback ? ", the default" : "") + ") or 0 (" + std::string(off_means) +
                (fallback ? "" : ", the default") + ")");
}

// One of `choices` (string literals: the result points into them).
inline std::string_view choice_or(const char* name, std::string_view fallback,
                                  std::initializer_list<std::string_view> choices) {
  const char* text = get(name);
  if (!text) return fallback;
  std::string expected = "one of:";
  for (std::string_view c : choices) {
    if (c == text) return c;
    expected.append(expected.back() == ':' ? " " : ", ").append(c);
  }
  malformed(name, text, expected);
}

// Text taken as it is (a path, a file name).
inline std::string text_or(const char* name, std::string_view fallback) {
  const char* text = get(name);
  return text ? std::string(text) : std::string(fallback);
}

}  // namespace weft::env
