// How every Weft program reads its command line — the examples, the demos,
// the trainer and the benchmarks: flags as "--flag value" or "--flag=value",
// one pass over argv. Each program keeps its own flags; this walks argv,
// reads whole numbers and comma lists, and names a bad command line.
#pragma once

#include <algorithm>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft::examples {

// A bad command line: the program prints the message and its usage and
// exits with status 2.
struct UsageError {
  std::string message;
};

class ArgCursor {
 public:
  ArgCursor(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // Moves to the next argument; false when there is none.
  bool next() {
    if (++i_ >= argc_) return false;
    flag_ = argv_[i_];
    inline_value_.reset();
    if (auto eq = flag_.find('='); flag_.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value_ = flag_.substr(eq + 1);
      flag_.resize(eq);
    }
    return true;
  }

  // The argument, without an "=value" part.
  const std::string& flag() const { return flag_; }
  // Whether the argument carried "=value" (a switch must not).
  bool has_inline_value() const { return inline_value_.has_value(); }

  // A whole number in [lo, hi] (all of `text`); nullopt otherwise.
  static std::optional<long long> parse_int(std::string_view text, long long lo, long long hi) {
    long long v = 0;
    const char* end = text.data() + text.size();
    auto [p, ec] = std::from_chars(text.data(), end, v);
    if (ec != std::errc() || p != end || v < lo || v > hi) return std::nullopt;
    return v;
  }

  // "a,b,,c" -> {"a", "b", "", "c"} (an empty text is one empty item): the
  // caller refuses empty items or skips them.
  static std::vector<std::string> split_list(std::string_view text) {
    std::vector<std::string> out;
    for (std::size_t at = 0; at <= text.size();) {
      const std::size_t comma = std::min(text.find(',', at), text.size());
      out.emplace_back(text.substr(at, comma - at));
      at = comma + 1;
    }
    return out;
  }

  // The flag's value: its "=value" part, else the next argument (consumed);
  // nullopt when the command line ends first.
  std::optional<std::string> value() {
    if (inline_value_) return inline_value_;
    if (i_ + 1 >= argc_) return std::nullopt;
    return std::string(argv_[++i_]);
  }
  // An optional value: the "=value" part, else the next argument when it
  // does not start with '-' (consumed); nullopt for a bare flag.
  std::optional<std::string> optional_value() {
    if (inline_value_) return inline_value_;
    if (i_ + 1 >= argc_ || argv_[i_ + 1][0] == '-') return std::nullopt;
    return std::string(argv_[++i_]);
  }
  // The flag's value as a whole number in [lo, hi]; nullopt when it is
  // missing or not one.
  std::optional<long long> int_value(long long lo, long long hi) {
    const std::optional<std::string> v = value();
    return v ? parse_int(*v, lo, hi) : std::nullopt;
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string flag_;
  std::optional<std::string> inline_value_;
};

}  // namespace weft::examples
