// weft::checkpoint — training state in safetensors files (the format
// PyTorch, JAX and numpy users read: an 8-byte little-endian header length,
// a JSON header of dtype / shape / data_offsets per tensor and a free-form
// "__metadata__" of strings, then the raw little-endian data).
//
// A checkpoint is a directory: one shard per writer ("rank-00000-of-00002.safetensors")
// and "index.json", written last (in the manner of sharded safetensors'
// model.safetensors.index.json: metadata, and which file holds each tensor
// or piece). A tensor is saved whole, or as pieces (flat element ranges of
// the whole, from the members that own them: ZeRO's shards), and loads back
// into any other split: N writers load on M.
//
// Saving snapshots every tensor with engine ops ordered after the writes
// pushed before, and writes the files from a background thread: the next
// step does not wait for the disk. A save writes a new directory and never
// overwrites a checkpoint in place (see save()), so a crash at any moment
// leaves the previous checkpoint, and `latest`, whole. Loading validates
// everything (files, keys, shapes, dtypes, ranges, the save's identity)
// before it overwrites any tensor, and reads every byte through the file
// it validated, so a refused load leaves them as they were. Errors are
// weft::InvalidArgument naming the file and the key.
// Design notes: docs/design/checkpoints.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weft/dtype.h"
#include "weft/engine.h"
#include "weft/shape.h"
#include "weft/tensor.h"

namespace weft::checkpoint {

using Metadata = std::map<std::string, std::string>;

// One tensor of a checkpoint, or a piece of one: flat elements [begin, end)
// of the whole tensor `name` of shape `shape`.
struct Entry {
  std::string name;
  // Save: what is written (its dtype is the saved dtype). Load: what is
  // overwritten (numel = end - begin, and the saved dtype).
  Tensor tensor;
  Shape shape;             // the whole tensor's; empty (rank 0, no dims given): tensor.shape()
  std::int64_t begin = 0;  // the piece
  std::int64_t end = -1;   // -1: to the end of the whole
  bool whole() const;      // begin == 0 and end covers the whole
};

// ---- one safetensors file -------------------------------------------------
// "F32", "BF16", "F16" <-> DType (other safetensors dtypes are refused, naming them).
const char* safetensors_dtype(DType dtype) noexcept;  // null for the other DTypes
std::optional<DType> dtype_from_safetensors(std::string_view name) noexcept;

struct HostTensor {
  std::string name;
  DType dtype = DType::float32;
  Shape shape;
  std::vector<std::byte> bytes;  // little-endian, shape.numel() * size of dtype
};
// Writes `file` atomically (file.tmp, fsync, rename, fsync of the directory).
void write_safetensors(const std::filesystem::path& file, const std::vector<HostTensor>& tensors,
                       const Metadata& metadata = {});

// A parsed and validated file: header length within the file, valid JSON,
// known dtypes, offsets in range, contiguous and not overlapping, and sizes
// that match the shapes. Data is read on demand.
class SafetensorsFile;
namespace detail {
SafetensorsFile open_safetensors_at(int dir_fd, const std::filesystem::path& name, const std::filesystem::path& shown);
}

class SafetensorsFile {
 public:
  struct Info {
    DType dtype = DType::float32;
    Shape shape;
    std::uint64_t begin = 0, end = 0;  // byte offsets after the header
  };
  static SafetensorsFile open(const std::filesystem::path& file);
  const std::filesystem::path& path() const noexcept { return path_; }
  const std::map<std::string, Info>& tensors() const noexcept { return tensors_; }
  const Metadata& metadata() const noexcept { return metadata_; }
  std::vector<std::byte> read(const std::string& name) const;  // throws naming the file and key
  // Bytes [first, end) of tensor `name`'s data.
  std::vector<std::byte> read(const std::string& name, std::uint64_t first, std::uint64_t end) const;

 private:
  friend SafetensorsFile detail::open_safetensors_at(int, const std::filesystem::path&, const std::filesystem::path&);
  struct Handle;  // the open file: every read goes through what open() validated
  std::shared_ptr<Handle> handle_;
  std::filesystem::path path_;
  std::uint64_t data_start_ = 0;
  std::map<std::string, Info> tensors_;
  Metadata metadata_;
};

// ---- checkpoints ------------------------------------------------------------
struct SaveOptions {
  int rank = 0;   // this writer
  // Writers in all; rank 0 writes index.json once every shard exists. One
  // process may save as several ranks (on the naive engine, which runs an
  // async op to its end as it is pushed, rank 0 last).
  int ranks = 1;
  Metadata metadata;  // saved in every shard and the index
  // Rank 0 waits this long for the other shards before it fails the save.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Set: the training run's directory. Rank 0 takes its lock (lock_run)
  // when save() is called, and once the checkpoint is complete points
  // run_dir/latest at `dir` (set_latest), so `latest` only ever names a
  // complete checkpoint; then it deletes all but the newest `keep`
  // checkpoints of run_dir (never the one `latest` names).
  std::filesystem::path run_dir;
  int keep = 3;  // >= 1 (0 is refused, naming it)
  // The save's identity, stored in every shard and the index: the same on
  // every rank of one save, and new for each save. Empty: a random one when
  // ranks == 1; with several ranks, a hash of dir's name, ranks and the
  // metadata (a crashed earlier save of the same name and metadata then
  // passes for this one: give an identity the ranks agreed on, as
  // DataParallel::save_checkpoint does).
  std::string save_id;
};

// A save in flight. wait() blocks until this writer's files are on disk
// (rank 0: the index too) and rethrows a failure; the destructor waits
// (and reports a failure nobody waited for on stderr). Like a Tensor, it
// must not outlive its engine.
class PendingSave {
 public:
  PendingSave() = default;
  PendingSave(PendingSave&&) noexcept;
  PendingSave& operator=(PendingSave&&) noexcept;
  ~PendingSave();
  void wait();
  bool done() const;
  // Written when the files are on disk: push an op reading it to order
  // something after the save (an undefined Var before any save).
  Var var() const;

 private:
  struct State;
  friend PendingSave save(Engine& engine, const std::filesystem::path& dir, std::vector<Entry> entries,
                          const SaveOptions& options);
  std::shared_ptr<State> state_;
};

// Pushes the snapshots of `entries` and the background write of this
// writer's shard of checkpoint directory `dir`; returns at once. Nothing is
// written in place: every rank writes its shard into "<dir>.partial" (file
// by file: temporary, fsync, rename, fsync of the directory); rank 0, once
// every shard of this save (its save_id) is there, writes the index the
// same way, renames the directory to `dir` and fsyncs its parent, and only
// then (with run_dir) swaps `latest`. A crash at any point leaves every
// complete checkpoint and `latest` loadable. `dir` existing already (a run
// resumed from an earlier checkpoint saving the same step again) is
// replaced in one atomic exchange, so its name always holds a complete
// checkpoint, old or new. Throws weft::InvalidArgument at once for an entry
// without a name or tensor, a repeated (name, piece), a piece out of its
// shape's range, a dtype safetensors cannot hold, keep < 1, or a run_dir
// another live job holds.
PendingSave save(Engine& engine, const std::filesystem::path& dir, std::vector<Entry> entries,
                 const SaveOptions& options = {});

// An opened checkpoint directory (or a single safetensors file): its index
// and every shard validated, each name's pieces known.
class Reader {
 public:
  // Throws weft::InvalidArgument naming the path: missing, no index.json, a
  // shard the index names that is missing or corrupt (naming the rank that
  // wrote it), pieces of one name that overlap or leave holes.
  static Reader open(const std::filesystem::path& path);
  const std::filesystem::path& path() const noexcept;
  const Metadata& metadata() const noexcept;
  int ranks() const noexcept;  // writers of the checkpoint
  std::vector<std::string> names() const;
  bool has(const std::string& name) const;
  Shape shape(const std::string& name) const;  // the whole tensor's
  DType dtype(const std::string& name) const;
  // Flat elements [begin, end) of `name` as raw bytes of its dtype (from
  // whichever shards hold them).
  std::vector<std::byte> read(const std::string& name, std::int64_t begin = 0, std::int64_t end = -1) const;

  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;
  ~Reader();

 private:
  Reader();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct LoadOptions {
  // true: every name in the checkpoint must be among the entries (else the
  // first extra key is an error), besides the other way round.
  bool strict = true;
};
// Overwrites every entry's tensor with its piece of the checkpoint (pushed
// copies; the host data is read first). Validates every entry (present,
// same whole shape, same dtype, range in bounds) before writing any.
void load(const Reader& reader, const std::vector<Entry>& entries, const LoadOptions& options = {});

// The newest checkpoint of a training run's directory: `run_dir`/latest, a
// symbolic link to a checkpoint directory beside it. set_latest points it at
// `checkpoint_dir` atomically (a new link renamed over the old one, then
// run_dir fsynced).
std::filesystem::path latest(const std::filesystem::path& run_dir);  // throws naming run_dir when there is none
void set_latest(const std::filesystem::path& run_dir, const std::filesystem::path& checkpoint_dir);

// Makes this process the only writer of `run_dir` for its lifetime (save()
// calls it for rank 0 with a run_dir; calling it again is a no-op): an
// exclusive flock on run_dir/lock, whose text names the owner's host and
// pid. Another live job holding it is a weft::InvalidArgument naming that
// host and pid; a lock whose owner died (even by SIGKILL) is taken over.
// Taking it removes what crashed saves left in run_dir ("*.partial",
// "*.replaced" directories, temporary links) except this process's own
// saves in progress (the partial directory of the save that takes it
// included: its other ranks may be writing there already). A job whose
// ranks may run a save ahead of rank 0 takes the lock before its first save
// (the trainers and weft-pipeline --dist do).
void lock_run(const std::filesystem::path& run_dir);

}  // namespace weft::checkpoint
