// What checkpoint.cpp needs of safetensors.cpp beyond the public header:
// writing a file straight from tensors' memory (no host copy of the bytes),
// and writing any small file atomically.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "weft/checkpoint.h"

namespace weft::checkpoint::detail {

// One tensor to write: `bytes` bytes at `data` (host memory).
struct TensorView {
  std::string name;
  DType dtype = DType::float32;
  Shape shape;
  const void* data = nullptr;
  std::size_t bytes = 0;
};

// As write_safetensors, from views.
void write_safetensors_views(const std::filesystem::path& file, const std::vector<TensorView>& tensors,
                             const Metadata& metadata);

// `file`.tmp written, fsynced and renamed over `file`, then the directory
// fsynced. Throws weft::Error naming the file and the system's reason.
void write_file_atomically(const std::filesystem::path& file, std::string_view text);

// Keys of a shard's __metadata__ that the checkpoint layer itself writes.
inline constexpr std::string_view kPiecesKey = "weft.pieces";
inline constexpr std::string_view kRankKey = "weft.rank";
inline constexpr std::string_view kRanksKey = "weft.ranks";
inline bool reserved_metadata_key(std::string_view key) {
  return key == kPiecesKey || key == kRankKey || key == kRanksKey;
}

}  // namespace weft::checkpoint::detail
