// What checkpoint.cpp needs of safetensors.cpp beyond the public header:
// writing a file straight from tensors' memory (no host copy of the bytes),
// and writing any small file atomically.
#pragma once

#include <cstddef>
#include <filesystem>
#include <nlohmann/json.hpp>
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

// fsync of a directory (its entries: a file renamed into it, a directory
// renamed). Throws weft::Error naming it.
void fsync_directory(const std::filesystem::path& dir);

// JSON text parsed with every object's keys checked unique: `duplicate`
// gets the first repeated key ("outer' key 'inner" when nested), else "".
// Throws nlohmann::json::exception on invalid JSON.
nlohmann::json parse_unique_keys(const std::string& text, std::string& duplicate);

// SafetensorsFile::open of `name` relative to the directory open as
// `dir_fd` (AT_FDCWD: the working directory), `shown` in messages. The
// file stays open: its data is read through the same descriptor.
SafetensorsFile open_safetensors_at(int dir_fd, const std::filesystem::path& name, const std::filesystem::path& shown);

// Keys of a shard's __metadata__ that the checkpoint layer itself writes.
inline constexpr std::string_view kPiecesKey = "weft.pieces";
inline constexpr std::string_view kRankKey = "weft.rank";
inline constexpr std::string_view kRanksKey = "weft.ranks";
// The save's identity, the same in each of its shards and its index: a
// shard with another identity belongs to another checkpoint.
inline constexpr std::string_view kSaveIdKey = "weft.save_id";
inline bool reserved_metadata_key(std::string_view key) {
  return key == kPiecesKey || key == kRankKey || key == kRanksKey || key == kSaveIdKey;
}

// ---- for tests only: simulated crashes ------------------------------------
// Tests (in a forked child) make the process SIGKILL itself the `nth` time
// it reaches crash point `point` of a save; "" turns it off. Not a setting:
// nothing but the checkpoint tests calls it. The points, in a save's order:
//   "file-synced"      a file's temporary written and fsynced, not renamed
//   "file-renamed"     a file renamed into place and its directory fsynced
//   "shards-durable"   rank 0: every shard durable, no index yet
//   "dir-renamed"      the partial directory renamed to its final name,
//                      its parent not fsynced yet
//   "committed"        the parent fsynced, `latest` not swapped yet
//   "latest-link-made" the new link made, not renamed over `latest`
//   "latest-swapped"   `latest` swapped and its directory fsynced, before
//                      the retention deletes anything
//   "retention-one"    one old checkpoint deleted by the retention
void set_crash_point(std::string_view point, int nth = 1);
void crash_point(std::string_view point);

}  // namespace weft::checkpoint::detail
