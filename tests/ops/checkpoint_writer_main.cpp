// Writes a checkpoint with known contents for tests/scripts/read_safetensors.py:
//   weft-test-checkpoint-writer OUT_DIR
// OUT_DIR/ckpt: a checkpoint of two writers (saved from this one process,
// rank by rank): float32, bfloat16 and float16 tensors, whole (a scalar, an
// empty one, matrices) and in pieces (one per writer, and two in one shard).
// OUT_DIR/plain.safetensors: the same tensors whole, in one file.
// OUT_DIR/expect.json: each tensor's name, dtype, shape and the bit patterns
// of its values widened to float32, and the metadata.
#include <bit>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/checkpoint.h"
#include "weft/dtype.h"
#include "weft/engine.h"
#include "weft/tensor.h"

namespace {

namespace ckpt = weft::checkpoint;
using weft::DType;
using weft::Shape;
using weft::Tensor;

float rounded(DType t, float v) {
  if (t == DType::bfloat16) return weft::bfloat16_to_float(weft::float_to_bfloat16(v));
  if (t == DType::float16) return weft::float16_to_float(weft::float_to_float16(v));
  return v;
}

struct Known {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<float> values;  // rounded to the dtype
};

std::vector<Known> known_tensors() {
  std::vector<Known> out;
  auto add = [&](std::string name, DType t, Shape s, float scale) {
    std::vector<float> v(static_cast<std::size_t>(s.numel()));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = rounded(t, scale * (static_cast<float>(i) * 0.37f - 3.1f) + (i % 7 == 3 ? 1e-3f : 0.0f));
    if (v.size() > 2) v[1] = -0.0f;
    out.push_back({std::move(name), t, std::move(s), std::move(v)});
  };
  add("conv.weight", DType::float32, Shape{4, 3, 2, 2}, 1.0f);
  add("conv.bias", DType::float32, Shape{4}, 0.5f);
  add("fc.weight", DType::bfloat16, Shape{5, 6}, 2.0f);
  add("fc.weight.exp_avg", DType::float16, Shape{5, 6}, 0.01f);
  add("scale", DType::float32, Shape{}, 3.0f);
  add("empty", DType::float16, Shape{0, 3}, 1.0f);
  add("embedding", DType::bfloat16, Shape{7, 3}, 0.25f);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const std::filesystem::path out = argv[1];
    std::filesystem::create_directories(out);
    auto engine = weft::Engine::create({.kind = "threaded", .cpu_devices = 1});
    const std::vector<Known> known = known_tensors();
    const ckpt::Metadata metadata{{"step", "42"}, {"model", "writer test"}};
    // fc.weight and fc.weight.exp_avg: a piece per writer; embedding: four
    // pieces, two per writer; the rest whole, from writer 0.
    std::vector<ckpt::PendingSave> saves;
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<ckpt::Entry> entries;
      for (const Known& k : known) {
        const std::int64_t n = k.shape.numel();
        const int pieces = k.name == "embedding" ? 4 : k.name.rfind("fc.", 0) == 0 ? 2 : 1;
        if (pieces == 1) {
          if (rank == 0) entries.push_back({k.name, Tensor::from_host(*engine, k.shape, k.values, {}, k.dtype)});
          continue;
        }
        const int per_rank = pieces / 2;
        for (int p = rank * per_rank; p < (rank + 1) * per_rank; ++p) {
          const std::int64_t size = (n + pieces - 1) / pieces;
          const std::int64_t lo = std::min(n, p * size), hi = std::min(n, (p + 1) * size);
          const std::vector<float> part(k.values.begin() + lo, k.values.begin() + hi);
          entries.push_back({k.name, Tensor::from_host(*engine, Shape{hi - lo}, part, {}, k.dtype), k.shape, lo, hi});
        }
      }
      saves.push_back(ckpt::save(*engine, out / "ckpt", entries, {.rank = rank, .ranks = 2, .metadata = metadata}));
    }
    for (ckpt::PendingSave& s : saves) s.wait();

    std::vector<ckpt::HostTensor> whole;
    nlohmann::json expect = {{"checkpoint", "ckpt"}, {"plain", "plain.safetensors"}, {"ranks", 2},
                             {"metadata", metadata}, {"tensors", nlohmann::json::array()}};
    for (const Known& k : known) {
      std::vector<std::uint32_t> bits;
      for (float v : k.values) bits.push_back(std::bit_cast<std::uint32_t>(v));
      expect["tensors"].push_back({{"name", k.name},
                                   {"dtype", ckpt::safetensors_dtype(k.dtype)},
                                   {"shape", k.shape.dims()},
                                   {"bits", bits}});
      ckpt::HostTensor h{k.name, k.dtype, k.shape, {}};
      for (float v : k.values) {
        if (k.dtype == DType::float32) {
          const auto b = std::bit_cast<std::uint32_t>(v);
          for (int i = 0; i < 4; ++i) h.bytes.push_back(static_cast<std::byte>(b >> (8 * i)));
        } else {
          const std::uint16_t b =
              k.dtype == DType::bfloat16 ? weft::float_to_bfloat16(v) : weft::float_to_float16(v);
          for (int i = 0; i < 2; ++i) h.bytes.push_back(static_cast<std::byte>(b >> (8 * i)));
        }
      }
      whole.push_back(std::move(h));
    }
    ckpt::write_safetensors(out / "plain.safetensors", whole, metadata);
    std::ofstream(out / "expect.json") << expect.dump(1) << "\n";
    engine->wait_all();
    std::printf("wrote %s\n", (out / "ckpt").c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-test-checkpoint-writer: %s\n", e.what());
    return 1;
  }
}
