// The byte-level corpus (weft/text_corpus.h): the 90/10 split, training
// batches (targets the inputs shifted by one, every row a sequence of the
// training split, every start reachable), their determinism per run value and step,
// the fixed validation batches, and every bad input named with its file.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "test_rng.h"
#include "weft/error.h"
#include "weft/text_corpus.h"

namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<std::uint8_t>;

// A fresh directory under the system temp dir, removed with its contents.
struct CorpusDir {
  fs::path path;
  CorpusDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("weft-corpus-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~CorpusDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const Bytes& bytes) const {
    const std::string file = (path / name).string();
    std::ofstream f(file, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(f.good());
    return file;
  }
};

Bytes random_bytes(std::size_t n, std::uint64_t s) {
  weft_test::Rng rng(s);
  Bytes b(n);
  for (std::uint8_t& v : b) v = static_cast<std::uint8_t>(rng.integer(0, 255));
  return b;
}

// The start of the sequence `row` of a batch in `bytes`, searched over
// [lo, hi]: the one offset whose bytes are the row's inputs and whose next
// bytes are its targets (-1: none; random bytes make it unique).
std::int64_t find_row(const Bytes& bytes, const std::vector<float>& inputs, const std::vector<float>& targets,
                      std::int64_t row, std::int64_t t, std::int64_t lo, std::int64_t hi) {
  std::int64_t found = -1;
  for (std::int64_t o = lo; o <= hi; ++o) {
    bool same = true;
    for (std::int64_t i = 0; i < t && same; ++i) {
      const auto at = static_cast<std::size_t>(row * t + i);
      same = inputs[at] == static_cast<float>(bytes[static_cast<std::size_t>(o + i)]) &&
             targets[at] == static_cast<float>(bytes[static_cast<std::size_t>(o + i + 1)]);
    }
    if (same) {
      if (found >= 0) return -2;  // ambiguous
      found = o;
    }
  }
  return found;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const weft::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("TextCorpus splits a file 90/10 as nanoGPT does" * doctest::timeout(60)) {
  CorpusDir dir;
  for (std::size_t n : {std::size_t{100}, std::size_t{105}, std::size_t{1009}}) {
    const weft::TextCorpus c = weft::TextCorpus::load(dir.write("t.txt", random_bytes(n, n)), 4);
    CHECK(c.size() == static_cast<std::int64_t>(n));
    // Python's int(n * 0.9) for these n.
    const std::int64_t want = n == 100 ? 90 : n == 105 ? 94 : 908;
    CHECK(c.train_size() == want);
    CHECK(c.validation_size() == static_cast<std::int64_t>(n) - want);
    CHECK(c.context() == 4);
  }
}

TEST_CASE("TextCorpus training batches: targets are the next bytes, rows lie in the training split" *
          doctest::timeout(60)) {
  CorpusDir dir;
  const Bytes bytes = random_bytes(2000, 7);
  const std::int64_t t = 16, b = 5;
  const weft::TextCorpus c = weft::TextCorpus::load(dir.write("t.txt", bytes), t);
  std::vector<float> x, y;
  for (std::int64_t step = 0; step < 20; ++step) {
    c.train_batch(3, step, b, x, y);
    REQUIRE(x.size() == static_cast<std::size_t>(b * t));
    REQUIRE(y.size() == static_cast<std::size_t>(b * t));
    for (std::int64_t r = 0; r < b; ++r) {
      // Within a row, each target is the next input.
      for (std::int64_t i = 0; i + 1 < t; ++i)
        CHECK(y[static_cast<std::size_t>(r * t + i)] == x[static_cast<std::size_t>(r * t + i + 1)]);
      // The row (and its last target) lies inside the training split.
      const std::int64_t o = find_row(bytes, x, y, r, t, 0, c.size() - t - 1);
      CHECK(o >= 0);
      CHECK(o + t < c.train_size());
    }
  }
}

TEST_CASE("TextCorpus training batches reach every start of the training split and no other" *
          doctest::timeout(60)) {
  CorpusDir dir;
  // 41 bytes: 36 training bytes, context 4: starts 0..31.
  const Bytes bytes = random_bytes(41, 11);
  const weft::TextCorpus c = weft::TextCorpus::load(dir.write("t.txt", bytes), 4);
  REQUIRE(c.train_size() == 36);
  std::set<std::int64_t> starts, want;
  for (std::int64_t o = 0; o < 32; ++o) want.insert(o);
  std::vector<float> x, y;
  for (std::int64_t step = 0; step < 100; ++step) {
    c.train_batch(0, step, 8, x, y);
    for (std::int64_t r = 0; r < 8; ++r) starts.insert(find_row(bytes, x, y, r, 4, 0, c.size() - 5));
  }
  CHECK(starts == want);
}

TEST_CASE("TextCorpus training batch is a function of the run value and the step: resumed runs draw the same bytes" *
          doctest::timeout(60)) {
  CorpusDir dir;
  const Bytes bytes = random_bytes(5000, 5);
  const std::string file = dir.write("t.txt", bytes);
  const weft::TextCorpus a = weft::TextCorpus::load(file, 32);
  const weft::TextCorpus b = weft::TextCorpus("in memory", bytes, 32);
  std::vector<float> x1, y1, x2, y2;
  // Drawn in another order, from another object: the same batches.
  std::vector<std::vector<float>> forward;
  for (std::int64_t step = 0; step < 6; ++step) {
    a.train_batch(42, step, 3, x1, y1);
    forward.push_back(x1);
  }
  for (std::int64_t step = 5; step >= 0; --step) {
    b.train_batch(42, step, 3, x2, y2);
    CHECK(x2 == forward[static_cast<std::size_t>(step)]);
  }
  // Another step or another run value: other offsets.
  a.train_batch(42, 0, 3, x1, y1);
  a.train_batch(42, 1, 3, x2, y2);
  CHECK(x1 != x2);
  a.train_batch(43, 0, 3, x2, y2);
  CHECK(x1 != x2);
  // A step past 2^32 is its own step, not step mod 2^32.
  a.train_batch(42, std::int64_t{1} << 32, 3, x2, y2);
  CHECK(x1 != x2);
}

TEST_CASE("TextCorpus validation batches: evenly spaced over the validation split, the same every time" *
          doctest::timeout(60)) {
  CorpusDir dir;
  const Bytes bytes = random_bytes(3000, 9);
  const std::int64_t t = 20, b = 3, count = 4;
  const weft::TextCorpus c = weft::TextCorpus::load(dir.write("t.txt", bytes), t);
  const std::int64_t sequences = b * count, span = c.validation_size() - t - 1;
  std::vector<float> x, y, x2, y2;
  for (std::int64_t i = 0; i < count; ++i) {
    c.validation_batch(i, count, b, x, y);
    c.validation_batch(i, count, b, x2, y2);
    CHECK(x == x2);
    CHECK(y == y2);
    for (std::int64_t r = 0; r < b; ++r) {
      const std::int64_t k = i * b + r;
      const std::int64_t want = c.train_size() + k * span / (sequences - 1);
      CHECK(find_row(bytes, x, y, r, t, 0, c.size() - t - 1) == want);
    }
  }
  // The first sequence starts the split, the last ends the file.
  c.validation_batch(0, count, b, x, y);
  CHECK(find_row(bytes, x, y, 0, t, 0, c.size() - t - 1) == c.train_size());
  c.validation_batch(count - 1, count, b, x, y);
  CHECK(find_row(bytes, x, y, b - 1, t, 0, c.size() - t - 1) == c.size() - t - 1);
  // One sequence: at the split's start.
  c.validation_batch(0, 1, 1, x, y);
  CHECK(find_row(bytes, x, y, 0, t, 0, c.size() - t - 1) == c.train_size());
}

TEST_CASE("TextCorpus names the file and the problem for every bad input" * doctest::timeout(60)) {
  CorpusDir dir;
  const std::string missing = (dir.path / "missing.txt").string();
  std::string m = message_of([&] { (void)weft::TextCorpus::load(missing, 8); });
  CHECK(m.find(missing) != std::string::npos);
  CHECK(m.find("no such file") != std::string::npos);

  const std::string empty = dir.write("empty.txt", {});
  m = message_of([&] { (void)weft::TextCorpus::load(empty, 8); });
  CHECK(m.find(empty) != std::string::npos);
  CHECK(m.find("empty") != std::string::npos);

  m = message_of([&] { (void)weft::TextCorpus::load(dir.path.string(), 8); });
  CHECK(m.find(dir.path.string()) != std::string::npos);
  CHECK(m.find("directory") != std::string::npos);

  // 81 bytes: 72 training, 9 validation; context 8 needs 9 in each: fine.
  // 80 bytes: 8 validation bytes, one short.
  const std::string fits = dir.write("fits.txt", random_bytes(81, 1));
  CHECK_NOTHROW((void)weft::TextCorpus::load(fits, 8));
  const std::string shorter = dir.write("short.txt", random_bytes(80, 1));
  m = message_of([&] { (void)weft::TextCorpus::load(shorter, 8); });
  CHECK(m.find(shorter) != std::string::npos);
  CHECK(m.find("72 training and 8 validation bytes") != std::string::npos);
  CHECK(m.find("context + 1 = 9 bytes (the file needs at least 81 bytes)") != std::string::npos);

  m = message_of([&] { (void)weft::TextCorpus::load(fits, 0); });
  CHECK(m.find(fits) != std::string::npos);
  CHECK(m.find("context 0") != std::string::npos);

  const weft::TextCorpus c = weft::TextCorpus::load(fits, 8);
  std::vector<float> x, y;
  m = message_of([&] { c.train_batch(0, 0, 0, x, y); });
  CHECK(m.find("batch 0 must be positive") != std::string::npos);
  m = message_of([&] { c.train_batch(0, -1, 1, x, y); });
  CHECK(m.find("step -1") != std::string::npos);
  m = message_of([&] { c.validation_batch(2, 2, 1, x, y); });
  CHECK(m.find("validation batch 2 of 2") != std::string::npos);
  CHECK(m.find(fits) != std::string::npos);
}

TEST_CASE("TextCorpus default_text_corpus: WEFT_TEXT_CORPUS when set, the installed text when unset or empty" *
          doctest::timeout(60)) {
  {
    weft_test::EnvGuard file("WEFT_TEXT_CORPUS", "/data/text.txt");
    CHECK(weft::default_text_corpus() == "/data/text.txt");
  }
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    weft_test::EnvGuard file("WEFT_TEXT_CORPUS", unset);
    CHECK(weft::default_text_corpus() == "/usr/local/share/weft/kjv.txt");
  }
}
