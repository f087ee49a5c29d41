// IDX reader, MNIST-style split loader and the minibatch iterator: small IDX
// files (plain and gzip) written into a temp dir, every malformed input named
// with its file and problem, and the real Fashion-MNIST when installed.
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "weft/dataset.h"
#include "weft/error.h"
#include "weft/idx.h"

namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<std::uint8_t>;

// A fresh directory under the system temp dir, removed with its contents.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("weft-idx-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// Header (00 00 type rank, big-endian dims) followed by data.
Bytes idx_bytes(std::uint8_t type, const std::vector<std::uint32_t>& dims, const Bytes& data) {
  Bytes b = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

void write_plain(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile g = gzopen(path.c_str(), "wb");
  REQUIRE(g != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(g, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(g) == Z_OK);
}

Bytes slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Deterministic, poorly compressible bytes.
Bytes noise(std::size_t n, std::uint32_t seed = 1) {
  Bytes b(n);
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (auto& v : b) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    v = static_cast<std::uint8_t>(x >> 24);
  }
  return b;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const weft::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a weft::Error> ") + e.what();
  }
  return "<no exception>";
}

// The message names `file` and contains `problem`.
void check_error(const std::string& msg, const std::string& file, const std::string& problem) {
  INFO("message: " << msg);
  CHECK(msg.find(file) != std::string::npos);
  CHECK(msg.find(problem) != std::string::npos);
}

void check_read_error(const std::string& path, const std::string& problem) {
  check_error(error_of([&] { weft::read_idx(path); }), path, problem);
}

}  // namespace

TEST_CASE("IDX read_idx reads plain and gzip files" * doctest::timeout(60)) {
  TempDir dir;
  const Bytes images = noise(4 * 3 * 5, 7);
  const Bytes labels = {0, 9, 3, 255};
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    const std::string ip = dir / (gz ? "i.idx.gz" : "i.idx");
    const std::string lp = dir / (gz ? "l.idx.gz" : "l.idx");
    (gz ? write_gz : write_plain)(ip, idx_bytes(0x08, {4, 3, 5}, images));
    (gz ? write_gz : write_plain)(lp, idx_bytes(0x08, {4}, labels));
    weft::IdxArray a = weft::read_idx(ip);
    CHECK(a.dims == std::vector<std::int64_t>{4, 3, 5});
    CHECK(a.data == images);
    weft::IdxArray l = weft::read_idx(lp);
    CHECK(l.dims == std::vector<std::int64_t>{4});
    CHECK(l.data == labels);
    // A zero dimension is a valid, empty array.
    const std::string ep = dir / (gz ? "e.idx.gz" : "e.idx");
    (gz ? write_gz : write_plain)(ep, idx_bytes(0x08, {0, 28, 28}, {}));
    weft::IdxArray e = weft::read_idx(ep);
    CHECK(e.dims == std::vector<std::int64_t>{0, 28, 28});
    CHECK(e.data.empty());
  }
  // A big-endian dimension above 2^24 is decoded whole (1 x 2^24 + 3 bytes).
  const std::string bp = dir / "big.idx.gz";
  const std::uint32_t n = (1u << 24) + 3;
  Bytes big(n, 0);
  big[0] = 1, big[n - 1] = 2;
  write_gz(bp, idx_bytes(0x08, {1, n}, big));
  weft::IdxArray b = weft::read_idx(bp);
  CHECK(b.dims == std::vector<std::int64_t>{1, n});
  CHECK(b.data == big);
}

TEST_CASE("IDX read_idx names the file and the problem for every malformed input" * doctest::timeout(60)) {
  TempDir dir;
  const Bytes data = noise(6000, 3);  // 10 x 20 x 30, hardly compressible
  const Bytes good = idx_bytes(0x08, {10, 20, 30}, data);

  SUBCASE("missing file") { check_read_error(dir / "nope-idx3-ubyte.gz", "missing file"); }
  SUBCASE("a directory") { check_read_error(dir.path.string(), "is a directory"); }
  SUBCASE("empty file") {
    write_plain(dir / "empty", {});
    check_read_error(dir / "empty", "truncated header");
  }
  SUBCASE("bad magic, plain and gzip") {
    Bytes bad = good;
    bad[0] = 0x12, bad[1] = 0x34;
    write_plain(dir / "bad", bad);
    check_read_error(dir / "bad", "bad magic 0x12340803");
    write_gz(dir / "bad.gz", bad);
    check_read_error(dir / "bad.gz", "bad magic 0x12340803");
  }
  SUBCASE("unknown element type") {
    write_plain(dir / "t07", idx_bytes(0x07, {3}, {1, 2, 3}));
    check_read_error(dir / "t07", "unknown IDX element type 0x07");
  }
  SUBCASE("unsupported element types") {
    write_plain(dir / "f32", idx_bytes(0x0D, {1}, {0, 0, 0, 0}));
    check_read_error(dir / "f32", "unsupported IDX element type 0x0D (float32)");
    write_gz(dir / "i32.gz", idx_bytes(0x0C, {1}, {0, 0, 0, 0}));
    check_read_error(dir / "i32.gz", "unsupported IDX element type 0x0C (int32)");
    write_plain(dir / "s8", idx_bytes(0x09, {1}, {0}));
    check_read_error(dir / "s8", "unsupported IDX element type 0x09 (signed byte)");
  }
  SUBCASE("rank 0") {
    write_plain(dir / "r0", {0, 0, 8, 0, 7});
    check_read_error(dir / "r0", "rank 0");
  }
  SUBCASE("truncated dimensions, plain and gzip") {
    Bytes cut(good.begin(), good.begin() + 10);  // magic + 1.5 of 3 dims
    write_plain(dir / "hdr", cut);
    check_read_error(dir / "hdr", "truncated header");
    write_gz(dir / "hdr.gz", cut);
    check_read_error(dir / "hdr.gz", "truncated header");
  }
  SUBCASE("truncated plain data") {
    write_plain(dir / "short", Bytes(good.begin(), good.end() - 1));
    check_read_error(dir / "short", "truncated data");
    check_read_error(dir / "short", "need 6000 bytes after the header, the file has 5999");
  }
  SUBCASE("gzip of truncated data") {
    write_gz(dir / "short.gz", Bytes(good.begin(), good.end() - 100));
    check_read_error(dir / "short.gz", "truncated data");
    check_read_error(dir / "short.gz", "has 5900");
  }
  SUBCASE("truncated gzip stream") {
    write_gz(dir / "full.gz", good);
    Bytes z = slurp(dir / "full.gz");
    REQUIRE(z.size() > 3000);
    write_plain(dir / "cut.gz", Bytes(z.begin(), z.begin() + static_cast<std::ptrdiff_t>(z.size() / 2)));
    check_read_error(dir / "cut.gz", "truncated data");
    check_read_error(dir / "cut.gz", "gzip stream is cut short");
    // All data there, only the 8-byte CRC/size trailer missing.
    write_plain(dir / "notrailer.gz", Bytes(z.begin(), z.end() - 8));
    check_read_error(dir / "notrailer.gz", "truncated gzip stream");
  }
  SUBCASE("corrupt gzip stream") {
    write_gz(dir / "full.gz", good);
    Bytes z = slurp(dir / "full.gz");
    z[z.size() - 8] ^= 0xFF;  // CRC32 in the trailer
    write_plain(dir / "crc.gz", z);
    check_read_error(dir / "crc.gz", "corrupt gzip stream");
  }
  SUBCASE("trailing data is an error, plain and gzip") {
    Bytes extra = good;
    extra.insert(extra.end(), {1, 2, 3});
    write_plain(dir / "extra", extra);
    check_read_error(dir / "extra", "trailing data: 3 bytes");
    write_gz(dir / "extra.gz", extra);
    check_read_error(dir / "extra.gz", "trailing data: 3 bytes");
  }
  SUBCASE("absurd dimensions") {
    // Exactly 2^34 bytes: over the limit.
    write_plain(dir / "huge", idx_bytes(0x08, {65536, 65536, 4}, {}));
    check_read_error(dir / "huge", "absurd dimensions [65536, 65536, 4]");
    // The product overflows 64 bits.
    write_gz(dir / "ovf.gz", idx_bytes(0x08, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {}));
    check_read_error(dir / "ovf.gz", "absurd dimensions");
    // Under the limit (12 GiB) but the file is tiny: truncated, without a
    // 12 GiB allocation first.
    write_plain(dir / "claims.idx", idx_bytes(0x08, {49152, 65536, 4}, {1, 2, 3}));
    check_read_error(dir / "claims.idx", "truncated data");
    write_gz(dir / "claims.idx.gz", idx_bytes(0x08, {49152, 65536, 4}, {1, 2, 3}));
    check_read_error(dir / "claims.idx.gz", "truncated data");
  }
}

namespace {

// A split of n images rows x cols with labels; pixel p of image i is (i*7+p)%256.
void write_split(const TempDir& dir, const std::string& split, std::uint32_t n, std::uint32_t rows,
                 std::uint32_t cols, bool gz, Bytes labels = {}) {
  Bytes px(std::size_t{n} * rows * cols);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t p = 0; p < std::size_t{rows} * cols; ++p) px[i * rows * cols + p] = static_cast<std::uint8_t>((i * 7 + p) % 256);
  if (labels.empty())
    for (std::uint32_t i = 0; i < n; ++i) labels.push_back(static_cast<std::uint8_t>(i % 10));
  const std::string sfx = gz ? ".gz" : "";
  (gz ? write_gz : write_plain)(dir / (split + "-images-idx3-ubyte" + sfx), idx_bytes(0x08, {n, rows, cols}, px));
  (gz ? write_gz : write_plain)(dir / (split + "-labels-idx1-ubyte" + sfx),
                                idx_bytes(0x08, {static_cast<std::uint32_t>(labels.size())}, labels));
}

}  // namespace

TEST_CASE("IDX load_mnist_split reads gzip and plain splits" * doctest::timeout(60)) {
  TempDir dir;
  write_split(dir, "train", 12, 3, 4, /*gz=*/true);
  write_split(dir, "t10k", 5, 2, 2, /*gz=*/false);

  weft::Dataset tr = weft::load_mnist_split(dir.path.string(), "train");
  CHECK(tr.size == 12);
  CHECK(tr.channels == 1);
  CHECK(tr.height == 3);
  CHECK(tr.width == 4);
  CHECK(tr.classes == 10);
  REQUIRE(tr.images.size() == 12u * 12u);
  REQUIRE(tr.labels.size() == 12u);
  for (std::size_t i = 0; i < 12; ++i) {
    CHECK(tr.labels[i] == static_cast<float>(i % 10));
    for (std::size_t p = 0; p < 12; ++p)
      CHECK(tr.images[i * 12 + p] == static_cast<float>((i * 7 + p) % 256) * (1.0f / 255.0f));
  }
  for (float v : tr.images) CHECK((v >= 0.0f && v <= 1.0f));

  weft::Dataset te = weft::load_mnist_split(dir.path.string(), "t10k", 3);
  CHECK(te.size == 3);
  CHECK(te.height == 2);
  CHECK(te.images.size() == 3u * 4u);
  CHECK(te.labels == std::vector<float>{0, 1, 2});
  CHECK(weft::load_mnist_split(dir.path.string(), "t10k", 100).size == 5);  // limit above the count

  // Both plain and .gz present: the plain one is read.
  write_split(dir, "t10k", 2, 2, 2, /*gz=*/true);
  CHECK(weft::load_mnist_split(dir.path.string(), "t10k").size == 5);

  CHECK(error_of([&] { weft::load_mnist_split(dir.path.string(), "t10k", -1); }).find("negative") !=
        std::string::npos);
}

TEST_CASE("IDX load_mnist_split names the file and the problem for inconsistent splits" * doctest::timeout(60)) {
  TempDir dir;
  const std::string d = dir.path.string();
  const std::string images = dir / "train-images-idx3-ubyte";
  const std::string labels = dir / "train-labels-idx1-ubyte";
  auto load = [&] { weft::load_mnist_split(d, "train"); };

  SUBCASE("missing images file") {
    check_error(error_of(load), images + ".gz", "missing file");
    check_error(error_of([] { weft::load_mnist_split("/nonexistent/weft-dir", "train"); }),
                "/nonexistent/weft-dir/train-images-idx3-ubyte", "does not exist");
  }
  SUBCASE("missing labels file") {
    write_split(dir, "train", 3, 2, 2, false);
    fs::remove(labels);
    check_error(error_of(load), labels, "missing file");
  }
  SUBCASE("images not rank 3") {
    write_split(dir, "train", 3, 2, 2, false);
    write_plain(images, idx_bytes(0x08, {3, 4}, Bytes(12)));
    check_error(error_of(load), images, "images must be rank 3");
  }
  SUBCASE("labels not rank 1") {
    write_split(dir, "train", 3, 2, 2, true);
    write_gz(labels + ".gz", idx_bytes(0x08, {3, 1}, {0, 1, 2}));
    check_error(error_of(load), labels + ".gz", "labels must be rank 1");
  }
  SUBCASE("zero-sized images") {
    write_split(dir, "train", 3, 2, 2, false);
    write_plain(images, idx_bytes(0x08, {3, 0, 28}, {}));
    check_error(error_of(load), images, "rows and cols must be positive");
  }
  SUBCASE("image count != label count") {
    write_split(dir, "train", 4, 2, 2, false, {0, 1, 2});
    std::string msg = error_of(load);
    check_error(msg, images, "count mismatch");
    check_error(msg, labels, "holds 4 images but");
    CHECK(msg.find("holds 3 labels") != std::string::npos);
  }
  SUBCASE("label out of range") {
    write_split(dir, "train", 5, 2, 2, true, {0, 9, 1, 10, 2});
    check_error(error_of(load), labels + ".gz", "label 10 at index 3 is not a class in 0..9");
  }
  SUBCASE("a malformed file is reported by read_idx") {
    write_split(dir, "train", 3, 2, 2, false);
    Bytes b = slurp(images);
    b.pop_back();
    write_plain(images, b);
    check_error(error_of(load), images, "truncated data");
  }
}

namespace {

// n examples of 2x2 pixels, all pixels of example i equal to i; label i % 10.
weft::Dataset indexed_dataset(std::int64_t n) {
  weft::Dataset d;
  d.size = n, d.height = 2, d.width = 2;
  for (std::int64_t i = 0; i < n; ++i) {
    for (int p = 0; p < 4; ++p) d.images.push_back(static_cast<float>(i));
    d.labels.push_back(static_cast<float>(i % 10));
  }
  return d;
}

// One epoch: the example indices in visiting order and the batch sizes; checks
// that every batch is self-consistent (4 equal pixels, matching label).
std::vector<std::int64_t> run_epoch(weft::MinibatchIterator& it, std::vector<std::int64_t>* sizes = nullptr) {
  std::vector<std::int64_t> seen;
  std::vector<float> images, labels;
  std::int64_t batch = -1;
  while (it.next(images, labels, batch)) {
    REQUIRE(images.size() == static_cast<std::size_t>(batch) * 4);
    REQUIRE(labels.size() == static_cast<std::size_t>(batch));
    for (std::int64_t b = 0; b < batch; ++b) {
      auto i = static_cast<std::int64_t>(images[static_cast<std::size_t>(b) * 4]);
      for (int p = 1; p < 4; ++p) CHECK(images[static_cast<std::size_t>(b) * 4 + static_cast<std::size_t>(p)] == static_cast<float>(i));
      CHECK(labels[static_cast<std::size_t>(b)] == static_cast<float>(i % 10));
      seen.push_back(i);
    }
    if (sizes) sizes->push_back(batch);
  }
  CHECK(batch == 0);
  return seen;
}

bool is_permutation_of_range(std::vector<std::int64_t> v, std::int64_t n) {
  std::sort(v.begin(), v.end());
  if (static_cast<std::int64_t>(v.size()) != n) return false;
  for (std::int64_t i = 0; i < n; ++i)
    if (v[static_cast<std::size_t>(i)] != i) return false;
  return true;
}

}  // namespace

TEST_CASE("Minibatch iterator covers every example once per epoch and shuffles per epoch deterministically per seed" *
          doctest::timeout(60)) {
  const weft::Dataset d = indexed_dataset(103);
  weft::MinibatchIterator it(d, 10, /*shuffle=*/true, /*seed=*/42);
  CHECK(it.batches_per_epoch() == 11);

  std::vector<std::vector<std::int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    it.start_epoch(e);
    std::vector<std::int64_t> sizes;
    epochs.push_back(run_epoch(it, &sizes));
    CHECK(is_permutation_of_range(epochs.back(), 103));
    CHECK(sizes == std::vector<std::int64_t>{10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 3});
    CHECK(it.order() == epochs.back());
  }
  std::vector<std::int64_t> identity(103);
  for (std::int64_t i = 0; i < 103; ++i) identity[static_cast<std::size_t>(i)] = i;
  CHECK(epochs[0] != identity);
  CHECK(epochs[0] != epochs[1]);
  CHECK(epochs[1] != epochs[2]);

  // Same seed and epoch: same order, from a new iterator and on a repeated epoch.
  weft::MinibatchIterator again(d, 7, true, 42);
  again.start_epoch(1);
  CHECK(run_epoch(again) == epochs[1]);
  it.start_epoch(0);
  CHECK(run_epoch(it) == epochs[0]);
  // The constructor starts epoch 0.
  weft::MinibatchIterator fresh(d, 10, true, 42);
  CHECK(run_epoch(fresh) == epochs[0]);
  // seed + epoch: (seed 43, epoch 0) is (seed 42, epoch 1).
  weft::MinibatchIterator shifted(d, 10, true, 43);
  CHECK(run_epoch(shifted) == epochs[1]);
  // Another seed: another order.
  weft::MinibatchIterator other(d, 10, true, 1234);
  CHECK(run_epoch(other) != epochs[0]);

  // No shuffle: 0..n-1 every epoch.
  weft::MinibatchIterator plain(d, 10, false, 42);
  CHECK(run_epoch(plain) == identity);
  plain.start_epoch(5);
  CHECK(run_epoch(plain) == identity);

  // A shuffled position is spread: over 200 epochs of 103 examples every
  // example lands in the first batch at least once.
  std::set<std::int64_t> firsts;
  for (int e = 0; e < 200; ++e) {
    it.start_epoch(e);
    for (std::size_t k = 0; k < 10; ++k) firsts.insert(it.order()[k]);
  }
  CHECK(firsts.size() == 103u);
}

TEST_CASE("Minibatch iterator last partial batch and drop_last" * doctest::timeout(60)) {
  const weft::Dataset d = indexed_dataset(103);
  SUBCASE("partial last batch kept") {
    weft::MinibatchIterator it(d, 25, true, 7);
    CHECK(it.batches_per_epoch() == 5);
    std::vector<std::int64_t> sizes;
    CHECK(is_permutation_of_range(run_epoch(it, &sizes), 103));
    CHECK(sizes == std::vector<std::int64_t>{25, 25, 25, 25, 3});
  }
  SUBCASE("drop_last drops it") {
    weft::MinibatchIterator it(d, 25, true, 7, /*drop_last=*/true);
    CHECK(it.batches_per_epoch() == 4);
    std::vector<std::int64_t> sizes;
    std::vector<std::int64_t> seen = run_epoch(it, &sizes);
    CHECK(sizes == std::vector<std::int64_t>{25, 25, 25, 25});
    CHECK(std::set<std::int64_t>(seen.begin(), seen.end()).size() == 100u);
    // Which 3 are dropped changes with the epoch.
    it.start_epoch(1);
    CHECK(run_epoch(it) != seen);
  }
  SUBCASE("exact multiple") {
    const weft::Dataset e = indexed_dataset(100);
    for (bool drop : {false, true}) {
      weft::MinibatchIterator it(e, 25, false, 0, drop);
      CHECK(it.batches_per_epoch() == 4);
      std::vector<std::int64_t> sizes;
      CHECK(is_permutation_of_range(run_epoch(it, &sizes), 100));
      CHECK(sizes == std::vector<std::int64_t>{25, 25, 25, 25});
    }
  }
  SUBCASE("batch larger than the dataset") {
    weft::MinibatchIterator keep(d, 1000, true, 7);
    CHECK(keep.batches_per_epoch() == 1);
    std::vector<std::int64_t> sizes;
    CHECK(is_permutation_of_range(run_epoch(keep, &sizes), 103));
    CHECK(sizes == std::vector<std::int64_t>{103});
    weft::MinibatchIterator drop(d, 1000, true, 7, true);
    CHECK(drop.batches_per_epoch() == 0);
    CHECK(run_epoch(drop).empty());
  }
  SUBCASE("empty dataset") {
    const weft::Dataset e = indexed_dataset(0);
    weft::MinibatchIterator it(e, 4, true, 7);
    CHECK(it.batches_per_epoch() == 0);
    CHECK(run_epoch(it).empty());
  }
}

TEST_CASE("Minibatch iterator rejects bad arguments" * doctest::timeout(60)) {
  weft::Dataset d = indexed_dataset(10);
  CHECK(error_of([&] { weft::MinibatchIterator(d, 0, true, 1); }).find("batch size 0 must be positive") !=
        std::string::npos);
  d.labels.pop_back();
  CHECK(error_of([&] { weft::MinibatchIterator(d, 4, true, 1); }).find("9 labels") != std::string::npos);
}

TEST_CASE("MNIST default_fashion_mnist_dir: WEFT_FASHION_MNIST when set, the system path when unset or empty" *
          doctest::timeout(60)) {
  {
    weft_test::EnvGuard dir("WEFT_FASHION_MNIST", "/data/fashion");
    CHECK(weft::default_fashion_mnist_dir() == "/data/fashion");
  }
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    weft_test::EnvGuard dir("WEFT_FASHION_MNIST", unset);
    CHECK(weft::default_fashion_mnist_dir() == "/usr/share/datasets/fashion-mnist");
  }
}

TEST_CASE("MNIST real Fashion-MNIST from default_fashion_mnist_dir" * doctest::timeout(300)) {
  const std::string dir = weft::default_fashion_mnist_dir();
  if (!fs::is_directory(dir)) {
    std::printf("[weft-skip] Fashion-MNIST not found at %s (install dataset-fashion-mnist or set WEFT_FASHION_MNIST)\n",
                dir.c_str());
    MESSAGE("[weft-skip] Fashion-MNIST not found at " << dir);
    return;
  }
  weft::Dataset train = weft::load_mnist_split(dir, "train");
  CHECK(train.size == 60000);
  CHECK(train.channels == 1);
  CHECK(train.height == 28);
  CHECK(train.width == 28);
  CHECK(train.images.size() == 60000u * 784u);
  REQUIRE(train.labels.size() == 60000u);
  std::vector<std::int64_t> counts(10, 0);
  bool labels_ok = true;
  for (float l : train.labels) {
    if (!(l >= 0.0f && l <= 9.0f) || l != static_cast<float>(static_cast<int>(l))) {
      labels_ok = false;
      continue;
    }
    ++counts[static_cast<std::size_t>(l)];
  }
  CHECK(labels_ok);
  CHECK(counts == std::vector<std::int64_t>(10, 6000));
  auto [lo, hi] = std::minmax_element(train.images.begin(), train.images.end());
  CHECK(*lo == 0.0f);
  CHECK(*hi == 1.0f);

  weft::Dataset test = weft::load_mnist_split(dir, "t10k");
  CHECK(test.size == 10000);
  CHECK(test.height == 28);
  CHECK(test.width == 28);
  REQUIRE(test.labels.size() == 10000u);
  std::vector<std::int64_t> tcounts(10, 0);
  for (float l : test.labels) {
    REQUIRE((l >= 0.0f && l <= 9.0f));
    ++tcounts[static_cast<std::size_t>(l)];
  }
  CHECK(tcounts == std::vector<std::int64_t>(10, 1000));

  // limit keeps the first examples.
  weft::Dataset head = weft::load_mnist_split(dir, "t10k", 100);
  CHECK(head.size == 100);
  CHECK(std::equal(head.images.begin(), head.images.end(), test.images.begin()));
  CHECK(std::equal(head.labels.begin(), head.labels.end(), test.labels.begin()));
}
