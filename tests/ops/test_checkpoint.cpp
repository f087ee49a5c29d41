// Checkpoints (weft/checkpoint.h) on CPU devices: float32, bfloat16 and
// float16 tensors round trip bitwise; pieces saved by 2 and 3 writers load
// whole and as other splits; a save returns before its data is ready and
// snapshots it; writes are atomic; write failures reach PendingSave::wait;
// the `latest` link; and every bad input is refused naming the file and the
// key, before any tensor is written. Naive and threaded engines.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "storage.h"
#include "test_rng.h"
#include "test_workers.h"
#include "weft/checkpoint.h"
#include "weft/dtype.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/tensor.h"

namespace {

namespace fs = std::filesystem;
namespace ckpt = weft::checkpoint;
using weft::Device;
using weft::DType;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
using i64 = std::int64_t;

// A fresh directory under the system's temporary one, removed at scope end.
struct CkptTmpDir {
  fs::path path;
  explicit CkptTmpDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("weft-ckpt-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~CkptTmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Each scenario on the naive engine and the threaded one at a couple of
// worker counts, two CPU devices.
void ckpt_each_engine(const std::function<void(Engine&)>& fn, bool naive = true) {
  if (naive) {
    INFO("naive engine");
    auto e = Engine::create({.kind = "naive", .cpu_devices = 2});
    fn(*e);
    e->wait_all();
  }
  const std::vector<int>& counts = weft_test::worker_counts();
  for (int w : {counts.front(), counts.back()}) {
    INFO("threaded engine, " << w << " workers per device");
    auto e = Engine::create({.kind = "threaded", .cpu_devices = 2, .workers_per_cpu_device = w});
    fn(*e);
    e->wait_all();
  }
}

const DType kCkptDTypes[] = {DType::float32, DType::bfloat16, DType::float16};

float ckpt_round(DType t, float v) {
  if (t == DType::bfloat16) return weft::bfloat16_to_float(weft::float_to_bfloat16(v));
  if (t == DType::float16) return weft::float16_to_float(weft::float_to_float16(v));
  return v;
}

// Values of dtype t (already rounded to it), with a few special ones.
std::vector<float> ckpt_values(i64 n, DType t, std::uint64_t seed) {
  weft_test::Rng rng(seed);
  std::vector<float> v = rng.vec(n, -3.0f, 3.0f);
  const float special[] = {0.0f, -0.0f, 1e-30f, 65504.0f, -1.5e-7f};
  for (std::size_t i = 0; i < v.size() && i < 5; ++i) v[i] = special[i];
  for (float& x : v) x = ckpt_round(t, x);
  return v;
}

std::vector<std::uint32_t> ckpt_bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> out;
  for (float x : v) out.push_back(std::bit_cast<std::uint32_t>(x));
  return out;
}

// The little-endian bytes of values of dtype t.
std::vector<std::byte> ckpt_bytes(const std::vector<float>& v, DType t) {
  std::vector<std::byte> out(v.size() * weft::dtype_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == DType::float32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const std::uint16_t h = t == DType::bfloat16 ? weft::float_to_bfloat16(v[i]) : weft::float_to_float16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

std::vector<float> ckpt_slice(const std::vector<float>& v, i64 begin, i64 end) {
  return {v.begin() + begin, v.begin() + end};
}

// [begin, end) of chunk k of n of `numel` elements (ZeRO's split: ceil).
std::pair<i64, i64> ckpt_chunk(i64 numel, int k, int n) {
  const i64 size = (numel + n - 1) / n;
  return {std::min(numel, k * size), std::min(numel, (k + 1) * size)};
}

// Runs fn, which must throw weft::InvalidArgument whose message holds every
// one of `parts`.
void ckpt_expect_invalid(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    FAIL_CHECK("no weft::InvalidArgument thrown (wanted one naming " << *parts.begin() << ")");
  } catch (const weft::InvalidArgument& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) CHECK_MESSAGE(what.find(p) != std::string::npos, what << "\n  lacks: " << p);
  }
}

std::string ckpt_read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void ckpt_write_file(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// A hand-made safetensors file: `header` as the JSON text, `data` bytes.
void ckpt_raw_file(const fs::path& p, const std::string& header, std::size_t data_bytes, std::uint64_t length = 0) {
  std::string s(8, '\0');
  const std::uint64_t n = length ? length : header.size();
  std::memcpy(s.data(), &n, 8);
  s += header;
  s.append(data_bytes, '\x01');
  ckpt_write_file(p, s);
}

struct CkptNamed {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<float> values;
};

std::vector<CkptNamed> ckpt_model() {
  std::vector<CkptNamed> out;
  const Shape shapes[] = {Shape{}, Shape{0}, Shape{7}, Shape{3, 4}, Shape{2, 3, 5}, Shape{2, 0, 3}};
  std::uint64_t seed = 1;
  for (DType t : kCkptDTypes) {
    int i = 0;
    for (const Shape& s : shapes)
      out.push_back({"layer" + std::to_string(i++) + "." + std::string(weft::to_string(t)), t, s,
                     ckpt_values(s.numel(), t, seed++)});
  }
  return out;
}

}  // namespace

TEST_CASE("checkpoint - float32, bfloat16 and float16 tensors round trip bitwise, with metadata" *
          doctest::timeout(120)) {
  const std::vector<CkptNamed> model = ckpt_model();
  ckpt_each_engine([&](Engine& engine) {
    CkptTmpDir tmp("roundtrip");
    const fs::path dir = tmp.path / "step-3";
    std::vector<ckpt::Entry> entries;
    int k = 0;
    for (const CkptNamed& m : model) {
      Tensor t = Tensor::from_host(engine, m.shape, m.values, Device::cpu(k++ % 2), m.dtype);
      entries.push_back({m.name, t});
    }
    const ckpt::Metadata metadata{{"step", "3"}, {"note", "caf\xc3\xa9, \"quoted\""}, {"empty", ""}};
    ckpt::PendingSave pending = ckpt::save(engine, dir, entries, {.metadata = metadata});
    pending.wait();
    CHECK(pending.done());
    CHECK(fs::exists(dir / "rank-00000-of-00001.safetensors"));
    CHECK(fs::exists(dir / "index.json"));
    CHECK_FALSE(fs::exists(dir / "rank-00000-of-00001.safetensors.tmp"));

    // The shard as a plain safetensors file: names, dtypes, shapes, bytes.
    const ckpt::SafetensorsFile file = ckpt::SafetensorsFile::open(dir / "rank-00000-of-00001.safetensors");
    CHECK(file.tensors().size() == model.size());
    CHECK(file.metadata().at("step") == "3");
    CHECK(file.metadata().at("note") == metadata.at("note"));
    for (const CkptNamed& m : model) {
      INFO(m.name);
      REQUIRE(file.tensors().count(m.name));
      CHECK(file.tensors().at(m.name).dtype == m.dtype);
      CHECK(file.tensors().at(m.name).shape == m.shape);
      CHECK(file.read(m.name) == ckpt_bytes(m.values, m.dtype));
    }

    const ckpt::Reader reader = ckpt::Reader::open(dir);
    CHECK(reader.metadata() == metadata);
    CHECK(reader.ranks() == 1);
    CHECK(reader.names().size() == model.size());
    std::vector<ckpt::Entry> targets;
    for (const CkptNamed& m : model) {
      CHECK(reader.shape(m.name) == m.shape);
      CHECK(reader.dtype(m.name) == m.dtype);
      CHECK(reader.read(m.name) == ckpt_bytes(m.values, m.dtype));
      targets.push_back({m.name, Tensor::full(engine, m.shape, 42.0f, Device::cpu(1), m.dtype)});
    }
    ckpt::load(reader, targets);
    for (std::size_t i = 0; i < model.size(); ++i) {
      INFO(model[i].name);
      CHECK(ckpt_bits(targets[i].tensor.to_host()) == ckpt_bits(model[i].values));
    }

    // A plain file written by write_safetensors opens as a checkpoint too.
    std::vector<ckpt::HostTensor> host;
    for (const CkptNamed& m : model) host.push_back({m.name, m.dtype, m.shape, ckpt_bytes(m.values, m.dtype)});
    ckpt::write_safetensors(tmp.path / "plain.safetensors", host, {{"source", "test"}});
    const ckpt::Reader plain = ckpt::Reader::open(tmp.path / "plain.safetensors");
    CHECK(plain.metadata() == ckpt::Metadata{{"source", "test"}});
    for (const CkptNamed& m : model) CHECK(plain.read(m.name) == ckpt_bytes(m.values, m.dtype));
    // Ranges of a whole tensor.
    CHECK(plain.read(model[4].name, 3, 9) ==
          ckpt_bytes(ckpt_slice(model[4].values, 3, 9), model[4].dtype));
  });
}

TEST_CASE("checkpoint - the file format: 8-byte length, JSON header padded to 8, contiguous data" *
          doctest::timeout(60)) {
  CkptTmpDir tmp("format");
  const fs::path f = tmp.path / "a.safetensors";
  const std::vector<float> v{1.0f, -2.0f, 0.5f};
  ckpt::write_safetensors(f, {{"b", DType::bfloat16, Shape{3}, ckpt_bytes(v, DType::bfloat16)},
                              {"a", DType::float32, Shape{3}, ckpt_bytes(v, DType::float32)}},
                          {{"k", "v"}});
  const std::string s = ckpt_read_file(f);
  std::uint64_t n = 0;
  std::memcpy(&n, s.data(), 8);
  CHECK(n % 8 == 0);
  REQUIRE(s.size() == 8 + n + 6 + 12);
  const nlohmann::json header = nlohmann::json::parse(s.substr(8, n));
  CHECK(header["b"]["dtype"] == "BF16");
  CHECK(header["b"]["shape"] == nlohmann::json::array({3}));
  CHECK(header["b"]["data_offsets"] == nlohmann::json::array({0, 6}));
  CHECK(header["a"]["data_offsets"] == nlohmann::json::array({6, 18}));
  CHECK(header["__metadata__"]["k"] == "v");
  CHECK(std::memcmp(s.data() + 8 + n + 6, v.data(), 12) == 0);
  CHECK(std::string(ckpt::safetensors_dtype(DType::float16)) == "F16");
  CHECK(ckpt::safetensors_dtype(DType::int32) == nullptr);
  CHECK(ckpt::dtype_from_safetensors("BF16") == DType::bfloat16);
  CHECK_FALSE(ckpt::dtype_from_safetensors("I64").has_value());
}

TEST_CASE("checkpoint - pieces from 2 and 3 writers load whole and as other splits" * doctest::timeout(180)) {
  // w: pieces per member (two members per writer, so a shard holds two
  // pieces of one name); b and h: a piece per writer; s: whole, by writer 0.
  const Shape w_shape{5, 7}, b_shape{10}, h_shape{3, 3}, s_shape{};
  const std::vector<float> w = ckpt_values(35, DType::float32, 11), b = ckpt_values(10, DType::bfloat16, 12),
                           h = ckpt_values(9, DType::float16, 13), s = ckpt_values(1, DType::float32, 14);
  ckpt_each_engine([&](Engine& engine) {
    CkptTmpDir tmp("pieces");
    for (int writers : {2, 3}) {
      CAPTURE(writers);
      const fs::path dir = tmp.path / ("by-" + std::to_string(writers));
      std::vector<ckpt::PendingSave> saves;
      // Rank 0 first: its index waits for the others. (The naive engine runs
      // each op as it is pushed, an async one until it completes: there rank
      // 0 comes last.)
      const bool naive = engine.kind() == "naive";
      for (int k = 0; k < writers; ++k) {
        const int r = naive ? writers - 1 - k : k;
        std::vector<ckpt::Entry> entries;
        for (int m = 2 * r; m < 2 * r + 2; ++m) {
          const auto [lo, hi] = ckpt_chunk(35, m, 2 * writers);
          entries.push_back({"w", Tensor::from_host(engine, Shape{hi - lo}, ckpt_slice(w, lo, hi), Device::cpu(m % 2)),
                             w_shape, lo, hi});
        }
        const auto [blo, bhi] = ckpt_chunk(10, r, writers);
        entries.push_back({"b", Tensor::from_host(engine, Shape{bhi - blo}, ckpt_slice(b, blo, bhi), Device::cpu(0),
                                                  DType::bfloat16),
                           b_shape, blo, bhi});
        const auto [hlo, hhi] = ckpt_chunk(9, r, writers);
        entries.push_back({"h", Tensor::from_host(engine, Shape{hhi - hlo}, ckpt_slice(h, hlo, hhi), Device::cpu(1),
                                                  DType::float16),
                           h_shape, hlo, hhi});
        if (r == 0) entries.push_back({"s", Tensor::from_host(engine, s_shape, s)});
        saves.push_back(ckpt::save(engine, dir, entries,
                                   {.rank = r, .ranks = writers, .metadata = {{"step", "7"}},
                                    .timeout = std::chrono::seconds(60), .run_dir = tmp.path}));
      }
      for (ckpt::PendingSave& p : saves) p.wait();
      REQUIRE(fs::exists(dir / "index.json"));
      CHECK(ckpt::latest(tmp.path) == dir);
      const nlohmann::json index = nlohmann::json::parse(ckpt_read_file(dir / "index.json"));
      CHECK(index["ranks"] == writers);
      CHECK(index["metadata"]["step"] == "7");
      CHECK(index["weight_map"]["s"] == "rank-00000-of-0000" + std::to_string(writers) + ".safetensors");
      CHECK(index["weight_map"]["w"].size() == static_cast<std::size_t>(writers));
      CHECK(index["tensors"]["w"]["shape"] == nlohmann::json::array({5, 7}));
      CHECK(index["tensors"]["w"]["pieces"].size() == static_cast<std::size_t>(2 * writers));

      const ckpt::Reader reader = ckpt::Reader::open(dir);
      CHECK(reader.ranks() == writers);
      CHECK(reader.shape("w") == w_shape);
      CHECK(reader.read("w") == ckpt_bytes(w, DType::float32));
      CHECK(reader.read("w", 4, 30) == ckpt_bytes(ckpt_slice(w, 4, 30), DType::float32));

      // Whole.
      Tensor tw = Tensor::zeros(engine, w_shape, Device::cpu(1));
      Tensor tb = Tensor::zeros(engine, b_shape, Device::cpu(0), DType::bfloat16);
      Tensor th = Tensor::zeros(engine, h_shape, Device::cpu(0), DType::float16);
      Tensor ts = Tensor::zeros(engine, s_shape);
      ckpt::load(reader, {{"w", tw}, {"b", tb}, {"h", th}, {"s", ts}});
      CHECK(ckpt_bits(tw.to_host()) == ckpt_bits(w));
      CHECK(ckpt_bits(tb.to_host()) == ckpt_bits(b));
      CHECK(ckpt_bits(th.to_host()) == ckpt_bits(h));
      CHECK(ckpt_bits(ts.to_host()) == ckpt_bits(s));

      // Other splits: 2 -> 3 and 3 -> 2 (and 4), each split's pieces as tensors.
      for (int parts : {5 - writers, 4}) {
        CAPTURE(parts);
        std::vector<ckpt::Entry> entries;
        std::vector<std::vector<float>> want;
        for (int p = 0; p < parts; ++p) {
          const auto [lo, hi] = ckpt_chunk(35, p, parts);
          entries.push_back({"w", Tensor::full(engine, Shape{hi - lo}, -1.0f, Device::cpu(p % 2)), w_shape, lo, hi});
          want.push_back(ckpt_slice(w, lo, hi));
          const auto [blo, bhi] = ckpt_chunk(10, p, parts);
          entries.push_back({"b", Tensor::full(engine, Shape{bhi - blo}, -1.0f, Device::cpu(0), DType::bfloat16),
                             b_shape, blo, bhi});
          want.push_back(ckpt_slice(b, blo, bhi));
        }
        ckpt::load(reader, entries, {.strict = false});
        for (std::size_t i = 0; i < entries.size(); ++i) {
          INFO("entry " << i);
          CHECK(ckpt_bits(entries[i].tensor.to_host()) == ckpt_bits(want[i]));
        }
      }
    }
  });
}

TEST_CASE("checkpoint - a save returns before its data is ready and keeps what was pushed before it" *
          doctest::timeout(120)) {
  ckpt_each_engine(
      [&](Engine& engine) {
        CkptTmpDir tmp("snapshot");
        const std::vector<float> before = ckpt_values(64, DType::float32, 21);
        Tensor t = Tensor::zeros(engine, Shape{8, 8}, Device::cpu(1));
        Tensor h = Tensor::zeros(engine, Shape{64}, Device::cpu(0), DType::bfloat16);
        t.wait_to_read();
        h.wait_to_read();
        // An op holding t's write access until the test lets it go, then
        // writing `before` into it.
        std::promise<void> gate;
        std::shared_future<void> open = gate.get_future().share();
        engine.push(
            [open, t, before] {
              open.wait();
              std::memcpy(t.storage()->data(), before.data(), before.size() * sizeof(float));
            },
            Device::cpu(1), {}, {t.var()});
        h.copy_from(Tensor::from_host(engine, Shape{64}, before, Device::cpu(0), DType::bfloat16));

        const auto start = std::chrono::steady_clock::now();
        ckpt::PendingSave pending = ckpt::save(engine, tmp.path / "ckpt", {{"t", t}, {"h", h}});
        CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
        CHECK_FALSE(pending.done());
        // Writes pushed after the save: the saved values stay those before.
        t.copy_from(Tensor::full(engine, Shape{8, 8}, 9.0f, Device::cpu(1)));
        h.copy_from(Tensor::full(engine, Shape{64}, 9.0f, Device::cpu(0), DType::bfloat16));
        // An op ordered after the save finds the files there.
        std::atomic<bool> found{false};
        engine.push([&] { found = fs::exists(tmp.path / "ckpt" / "index.json"); }, {pending.var()}, {});
        gate.set_value();
        pending.wait();
        engine.wait_all();
        CHECK(found);
        const ckpt::Reader reader = ckpt::Reader::open(tmp.path / "ckpt");
        CHECK(reader.read("t") == ckpt_bytes(before, DType::float32));
        CHECK(reader.read("h") == ckpt_bytes(before, DType::bfloat16));
        CHECK(t.to_host() == std::vector<float>(64, 9.0f));
      },
      /*naive=*/false);  // the naive engine runs each op as it is pushed: the gate would hold the frontend
}

TEST_CASE("checkpoint - writes are atomic: a leftover .tmp or a failed write leaves the previous file whole" *
          doctest::timeout(60)) {
  CkptTmpDir tmp("atomic");
  const fs::path f = tmp.path / "m.safetensors";
  const std::vector<float> a{1, 2, 3}, b{4, 5, 6}, c{7, 8, 9};
  ckpt::write_safetensors(f, {{"x", DType::float32, Shape{3}, ckpt_bytes(a, DType::float32)}});
  // A crash mid-write leaves file.tmp behind: the file itself is the old one.
  ckpt_write_file(fs::path(f.string() + ".tmp"), "half a header");
  CHECK(ckpt::Reader::open(f).read("x") == ckpt_bytes(a, DType::float32));
  // The next write replaces both.
  ckpt::write_safetensors(f, {{"x", DType::float32, Shape{3}, ckpt_bytes(b, DType::float32)}});
  CHECK(ckpt::Reader::open(f).read("x") == ckpt_bytes(b, DType::float32));
  CHECK_FALSE(fs::exists(f.string() + ".tmp"));
  // A write that fails (its temporary file cannot be created) leaves it too.
  fs::create_directory(f.string() + ".tmp");
  try {
    ckpt::write_safetensors(f, {{"x", DType::float32, Shape{3}, ckpt_bytes(c, DType::float32)}});
    FAIL_CHECK("writing over a directory did not fail");
  } catch (const weft::Error& e) {
    CHECK(std::string(e.what()).find(f.string() + ".tmp") != std::string::npos);
  }
  CHECK(ckpt::Reader::open(f).read("x") == ckpt_bytes(b, DType::float32));

  // Checkpoints: a failed save leaves `latest` at the previous whole one.
  ckpt_each_engine([&](Engine& engine) {
    CkptTmpDir run("atomic-run");
    Tensor t = Tensor::from_host(engine, Shape{3}, a);
    ckpt::save(engine, run.path / "step-1", {{"x", t}}, {.run_dir = run.path}).wait();
    ckpt_write_file(run.path / "blocker", "a regular file");
    t.copy_from(Tensor::from_host(engine, Shape{3}, b));
    ckpt::PendingSave failed = ckpt::save(engine, run.path / "blocker" / "step-2", {{"x", t}}, {.run_dir = run.path});
    CHECK_THROWS_AS(failed.wait(), weft::Error);
    CHECK(ckpt::latest(run.path) == run.path / "step-1");
    CHECK(ckpt::Reader::open(ckpt::latest(run.path)).read("x") == ckpt_bytes(a, DType::float32));
  });
}

TEST_CASE("checkpoint - PendingSave::wait rethrows a failed write, naming the path" * doctest::timeout(60)) {
  ckpt_each_engine([&](Engine& engine) {
    CkptTmpDir tmp("fail");
    // Tests may run as root: a directory under a regular file fails for anyone.
    ckpt_write_file(tmp.path / "file", "x");
    const fs::path dir = tmp.path / "file" / "ckpt";
    Tensor t = Tensor::ones(engine, Shape{4});
    ckpt::PendingSave pending = ckpt::save(engine, dir, {{"t", t}});
    for (int attempt = 0; attempt < 2; ++attempt) {  // and again on a second wait
      try {
        pending.wait();
        FAIL_CHECK("the save did not fail");
      } catch (const weft::Error& e) {
        CHECK(std::string(e.what()).find(dir.string()) != std::string::npos);
      }
    }
    CHECK(pending.done());
    // Rank 0 of 2 fails when the other shard never comes.
    ckpt::PendingSave alone =
        ckpt::save(engine, tmp.path / "alone", {{"t", t}}, {.ranks = 2, .timeout = std::chrono::milliseconds(50)});
    try {
      alone.wait();
      FAIL_CHECK("rank 0 wrote an index without rank 1's shard");
    } catch (const weft::Error& e) {
      CHECK(std::string(e.what()).find("rank 1") != std::string::npos);
    }
    CHECK_FALSE(fs::exists(tmp.path / "alone" / "index.json"));
  });
}

TEST_CASE("checkpoint - save refuses bad entries at once, naming them" * doctest::timeout(60)) {
  auto engine = Engine::create({.kind = "threaded", .cpu_devices = 1});
  CkptTmpDir tmp("bad-save");
  const fs::path dir = tmp.path / "c";
  Tensor t = Tensor::zeros(*engine, Shape{4});
  ckpt_expect_invalid([&] { ckpt::save(*engine, dir, {{"", t}}); }, {dir.string(), "no name"});
  ckpt_expect_invalid([&] { ckpt::save(*engine, dir, {{"u", Tensor()}}); }, {dir.string(), "'u'"});
  ckpt_expect_invalid([&] { ckpt::save(*engine, dir, {{"t", t}, {"t", t}}); }, {"'t'", "twice"});
  ckpt_expect_invalid([&] { ckpt::save(*engine, dir, {{"t", t, Shape{10}, 8, 12}}); }, {"'t'", "outside"});
  ckpt_expect_invalid([&] { ckpt::save(*engine, dir, {{"t", t, Shape{10}, 0, 3}}); }, {"'t'", "elements"});
  ckpt_expect_invalid([&] { ckpt::save(*engine, dir, {{"t", t, Shape{10}, 0, 4}, {"t", t, Shape{10}, 2, 6}}); },
                      {"'t'", "overlap"});
  Tensor i = Tensor::empty(*engine, Shape{4}, Device::cpu(0), DType::int32);
  ckpt_expect_invalid([&] { ckpt::save(*engine, dir, {{"i", i}}); }, {"'i'", "int32"});
  ckpt_expect_invalid([&] { ckpt::save(*engine, dir, {{"t", t}}, {.rank = 2, .ranks = 2}); }, {"rank 2"});
  engine->wait_all();
  CHECK_FALSE(fs::exists(dir));
}

TEST_CASE("checkpoint - the latest link names the newest whole checkpoint" * doctest::timeout(60)) {
  CkptTmpDir tmp("latest");
  const fs::path run = tmp.path / "run";
  ckpt_expect_invalid([&] { ckpt::latest(run); }, {run.string()});
  fs::create_directories(run / "step-1");
  fs::create_directories(run / "step-2");
  ckpt::set_latest(run, run / "step-1");
  CHECK(fs::is_symlink(run / "latest"));
  CHECK(fs::read_symlink(run / "latest") == "step-1");  // relative: the run directory may move
  CHECK(ckpt::latest(run) == run / "step-1");
  ckpt::set_latest(run, run / "step-2");
  CHECK(ckpt::latest(run) == run / "step-2");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(run)) ++entries;
  CHECK(entries == 3);  // step-1, step-2, latest: no temporary link left
}

// ---- bad input ------------------------------------------------------------------

namespace {

// A checkpoint of w [5, 7] float32, b [10] bfloat16, c [3] float32, saved
// by `writers` writers (w and b in pieces), and the model's tensors to load
// it into, filled with 5 (so a refused load can be seen to leave them).
struct CkptBadCase {
  fs::path dir;
  Tensor w, b, c;
  std::vector<ckpt::Entry> entries() const { return {{"w", w}, {"b", b}, {"c", c}}; }
  void check_unchanged() const {
    CHECK(w.to_host() == std::vector<float>(35, 5.0f));
    CHECK(b.to_host() == std::vector<float>(10, 5.0f));
    CHECK(c.to_host() == std::vector<float>(3, 5.0f));
  }
};

CkptBadCase ckpt_bad_case(Engine& engine, const fs::path& dir, int writers) {
  for (int r = writers - 1; r >= 0; --r) {
    const auto [lo, hi] = ckpt_chunk(35, r, writers);
    const auto [blo, bhi] = ckpt_chunk(10, r, writers);
    std::vector<ckpt::Entry> e{
        {"w", Tensor::full(engine, Shape{hi - lo}, 1.0f), Shape{5, 7}, lo, hi},
        {"b", Tensor::full(engine, Shape{bhi - blo}, 2.0f, Device::cpu(0), DType::bfloat16), Shape{10}, blo, bhi}};
    if (r == 0) e.push_back({"c", Tensor::full(engine, Shape{3}, 3.0f)});
    ckpt::save(engine, dir, e, {.rank = r, .ranks = writers}).wait();
  }
  return {dir, Tensor::full(engine, Shape{5, 7}, 5.0f), Tensor::full(engine, Shape{10}, 5.0f, Device::cpu(1), DType::bfloat16),
          Tensor::full(engine, Shape{3}, 5.0f)};
}

}  // namespace

TEST_CASE("checkpoint - bad input: missing file, missing and extra keys, shapes, dtypes, another model" *
          doctest::timeout(120)) {
  ckpt_each_engine([&](Engine& engine) {
    CkptTmpDir tmp("bad-keys");
    const CkptBadCase m = ckpt_bad_case(engine, tmp.path / "ckpt", 2);
    const ckpt::Reader reader = ckpt::Reader::open(m.dir);
    const std::string dir = m.dir.string();

    ckpt_expect_invalid([&] { ckpt::Reader::open(tmp.path / "missing"); }, {(tmp.path / "missing").string()});
    ckpt_expect_invalid([&] { ckpt::Reader::open(tmp.path / "missing.safetensors"); },
                        {(tmp.path / "missing.safetensors").string()});
    // A key the model has and the checkpoint lacks (listed last: the entries
    // before it would be written if the load did not check first).
    Tensor d = Tensor::full(engine, Shape{2}, 5.0f);
    auto with_d = m.entries();
    with_d.push_back({"d", d});
    ckpt_expect_invalid([&] { ckpt::load(reader, with_d); }, {dir, "'d'", "not in the checkpoint"});
    CHECK(d.to_host() == std::vector<float>(2, 5.0f));
    m.check_unchanged();
    // A key the checkpoint has and the model lacks (strict).
    ckpt_expect_invalid([&] { ckpt::load(reader, {{"w", m.w}, {"b", m.b}}); }, {dir, "'c'", "not in the model"});
    m.check_unchanged();
    // A shape that differs.
    Tensor c4 = Tensor::full(engine, Shape{4}, 5.0f);
    ckpt_expect_invalid([&] { ckpt::load(reader, {{"w", m.w}, {"b", m.b}, {"c", c4}}); }, {dir, "'c'", "[3]", "[4]"});
    m.check_unchanged();
    // A dtype that differs.
    Tensor b32 = Tensor::full(engine, Shape{10}, 5.0f);
    ckpt_expect_invalid([&] { ckpt::load(reader, {{"w", m.w}, {"b", b32}, {"c", m.c}}); },
                        {dir, "'b'", "bfloat16", "float32"});
    CHECK(b32.to_host() == std::vector<float>(10, 5.0f));
    m.check_unchanged();
    // A piece out of range.
    Tensor piece = Tensor::full(engine, Shape{5}, 5.0f);
    ckpt_expect_invalid([&] { ckpt::load(reader, {{"w", piece, Shape{5, 7}, 33, 38}}, {.strict = false}); },
                        {dir, "'w'", "outside"});
    // A checkpoint of another model.
    Tensor fc = Tensor::full(engine, Shape{10, 4}, 5.0f);
    ckpt_expect_invalid([&] { ckpt::load(reader, {{"fc.weight", fc}}); }, {dir, "'fc.weight'"});
    CHECK(fc.to_host() == std::vector<float>(40, 5.0f));
    // The same load with the right entries goes through.
    ckpt::load(reader, m.entries());
    CHECK(m.w.to_host() == std::vector<float>(35, 1.0f));
    CHECK(m.c.to_host() == std::vector<float>(3, 3.0f));
  });
}

TEST_CASE("checkpoint - bad input: truncated and corrupt files, each named with its key" * doctest::timeout(120)) {
  ckpt_each_engine([&](Engine& engine) {
    CkptTmpDir tmp("bad-files");
    const CkptBadCase m = ckpt_bad_case(engine, tmp.path / "ckpt", 1);
    const fs::path shard = m.dir / "rank-00000-of-00001.safetensors";
    const std::string good = ckpt_read_file(shard);
    const std::string s = shard.string();
    auto refused = [&](std::initializer_list<std::string> parts) {
      ckpt_expect_invalid([&] { ckpt::load(ckpt::Reader::open(m.dir), m.entries()); }, parts);
      ckpt_expect_invalid([&] { ckpt::Reader::open(shard); }, parts);
      m.check_unchanged();
      ckpt_write_file(shard, good);
    };
    // Truncated: shorter than the length, inside the header, inside the data.
    ckpt_write_file(shard, good.substr(0, 5));
    refused({s, "8-byte header length"});
    ckpt_write_file(shard, good.substr(0, 40));
    refused({s, "header length", "past the end"});
    ckpt_write_file(shard, good.substr(0, good.size() - 4));
    refused({s, "'w'", "past the end of the data"});  // w is stored last: its key is named
    // Header length past the end.
    std::string bad = good;
    const std::uint64_t huge = std::uint64_t{1} << 40;
    std::memcpy(bad.data(), &huge, 8);
    ckpt_write_file(shard, bad);
    refused({s, "header length 1099511627776", "past the end"});
    // Invalid JSON.
    bad = good;
    bad[8] = '[';
    bad[9] = '}';
    ckpt_write_file(shard, bad);
    refused({s, "invalid JSON"});
    // Hand-made headers: overlapping, out-of-range, non-contiguous offsets,
    // sizes that do not match the shape, an unknown dtype.
    const fs::path f = tmp.path / "hand.safetensors";
    const std::string fs_ = f.string();
    auto hand = [&](const std::string& header, std::size_t data, std::initializer_list<std::string> parts) {
      ckpt_raw_file(f, header, data);
      ckpt_expect_invalid([&] { ckpt::Reader::open(f); }, parts);
    };
    hand(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
         12, {fs_, "'b'", "overlap", "'a'"});
    hand(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
         12, {fs_, "'b'", "past the end of the data"});
    hand(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
         20, {fs_, "'b'", "contiguous"});
    hand(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12, {fs_, "4 bytes", "'a'"});
    hand(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, {fs_, "'a'", "[3]", "needs 12"});
    hand(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8, {fs_, "'a'", "I64"});
    hand(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0, {fs_, "'a'", "shape"});
    hand(R"({"a":{"dtype":"F32","shape":[1]}})", 4, {fs_, "'a'", "data_offsets"});
    hand(R"({"__metadata__":{"k":1}})", 0, {fs_, "'k'"});
    hand(R"([1, 2])", 0, {fs_, "not an object"});
    // Pieces of one name that overlap or leave holes (a plain file with the
    // pieces' metadata).
    const std::string pieces_overlap =
        R"({"w[0:2]":{"name":"w","shape":[4],"begin":0,"end":2},"w[1:4]":{"name":"w","shape":[4],"begin":1,"end":4}})";
    ckpt::write_safetensors(f,
                            {{"w[0:2]", DType::float32, Shape{2}, ckpt_bytes({1, 2}, DType::float32)},
                             {"w[1:4]", DType::float32, Shape{3}, ckpt_bytes({2, 3, 4}, DType::float32)}},
                            {{"weft.pieces", pieces_overlap}});
    ckpt_expect_invalid([&] { ckpt::Reader::open(f); }, {fs_, "'w'", "overlaps"});
    const std::string pieces_hole =
        R"({"w[0:1]":{"name":"w","shape":[4],"begin":0,"end":1},"w[2:4]":{"name":"w","shape":[4],"begin":2,"end":4}})";
    ckpt::write_safetensors(f,
                            {{"w[0:1]", DType::float32, Shape{1}, ckpt_bytes({1}, DType::float32)},
                             {"w[2:4]", DType::float32, Shape{2}, ckpt_bytes({3, 4}, DType::float32)}},
                            {{"weft.pieces", pieces_hole}});
    ckpt_expect_invalid([&] { ckpt::Reader::open(f); }, {fs_, "'w'", "[1, 2)", "no piece"});
  });
}

TEST_CASE("checkpoint - bad input: a distributed checkpoint's missing shard, index and pieces" *
          doctest::timeout(120)) {
  ckpt_each_engine([&](Engine& engine) {
    CkptTmpDir tmp("bad-dist");
    const CkptBadCase m = ckpt_bad_case(engine, tmp.path / "ckpt", 3);
    const std::string dir = m.dir.string();
    const fs::path index = m.dir / "index.json";
    const std::string good_index = ckpt_read_file(index);
    // A shard missing: the rank that wrote it is named.
    const fs::path shard1 = m.dir / "rank-00001-of-00003.safetensors";
    fs::rename(shard1, tmp.path / "moved");
    ckpt_expect_invalid([&] { ckpt::load(ckpt::Reader::open(m.dir), m.entries()); },
                        {dir, "rank 1", "rank-00001-of-00003.safetensors", "missing"});
    m.check_unchanged();
    // A corrupt shard: the rank and the file.
    ckpt_write_file(shard1, "garbage!garbage!");
    ckpt_expect_invalid([&] { ckpt::Reader::open(m.dir); }, {dir, "rank 1", shard1.string(), "header length"});
    fs::rename(tmp.path / "moved", shard1);
    // No index: an unfinished save.
    fs::rename(index, tmp.path / "index.json");
    ckpt_expect_invalid([&] { ckpt::Reader::open(m.dir); }, {dir, "index.json"});
    fs::rename(tmp.path / "index.json", index);
    // A corrupt index.
    ckpt_write_file(index, "{\"ranks\": 3, ");
    ckpt_expect_invalid([&] { ckpt::Reader::open(m.dir); }, {index.string(), "invalid JSON"});
    nlohmann::json edited = nlohmann::json::parse(good_index);
    edited["tensors"]["w"]["shape"] = {5, 8};
    ckpt_write_file(index, edited.dump());
    ckpt_expect_invalid([&] { ckpt::Reader::open(m.dir); }, {index.string(), "'w'"});
    edited = nlohmann::json::parse(good_index);
    edited.erase("ranks");
    ckpt_write_file(index, edited.dump());
    ckpt_expect_invalid([&] { ckpt::Reader::open(m.dir); }, {index.string(), "'ranks'"});
    ckpt_write_file(index, good_index);
    ckpt::load(ckpt::Reader::open(m.dir), m.entries());
    CHECK(m.b.to_host() == std::vector<float>(10, 2.0f));

    // Pieces saved by two writers that overlap, or leave a hole: rank 0's
    // index refuses them, naming the tensor.
    for (const auto& [lo1, label] : {std::pair<i64, const char*>{3, "overlaps"}, {6, "no piece"}}) {
      const fs::path d = tmp.path / label;
      ckpt::save(engine, d, {{"v", Tensor::zeros(engine, Shape{10 - lo1}), Shape{10}, lo1, 10}}, {.rank = 1, .ranks = 2})
          .wait();
      ckpt::PendingSave p0 =
          ckpt::save(engine, d, {{"v", Tensor::zeros(engine, Shape{5}), Shape{10}, 0, 5}}, {.rank = 0, .ranks = 2});
      ckpt_expect_invalid([&] { p0.wait(); }, {d.string(), "'v'", label});
      CHECK_FALSE(fs::exists(d / "index.json"));
    }
  });
}
