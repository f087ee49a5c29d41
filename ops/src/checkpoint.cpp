// Checkpoint directories: saves (snapshots pushed as engine ops, files
// written by one background writer thread), the index, validated loads and
// the run directory's `latest` link. docs/design/checkpoints.md.
#include "weft/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "checkpoint_io.h"
#include "launch.h"
#include "storage.h"
#include "weft/error.h"
#include "weft/ops.h"

namespace weft::checkpoint {

using nlohmann::json;
namespace fs = std::filesystem;
using detail::kPiecesKey;
using detail::kRankKey;
using detail::kRanksKey;
using detail::kSaveIdKey;

bool Entry::whole() const {
  const Shape& s = shape.rank() == 0 && tensor.defined() ? tensor.shape() : shape;
  return begin == 0 && (end == -1 || end == s.numel());
}

namespace {

std::string quoted(const fs::path& p) {
  std::string s = "'";
  s += p.string();
  s += '\'';
  return s;
}

std::string shard_file_name(int rank, int ranks) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05d-of-%05d.safetensors", rank, ranks);
  return buf;
}

std::string range_str(std::int64_t begin, std::int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// ---- one name's pieces, from shard headers ---------------------------------

struct Piece {
  int file = 0;     // index into the shard list
  std::string key;  // the tensor's key in that file
  std::int64_t begin = 0, end = 0;
};
struct Named {
  DType dtype = DType::float32;
  Shape shape;
  std::vector<Piece> pieces;  // sorted by begin once checked
};
using NameTable = std::map<std::string, Named>;

// Adds the tensors of `file` (the files[index] of a checkpoint) to `table`:
// whole tensors under their key, pieces as "weft.pieces" says.
void collect(const SafetensorsFile& file, int index, const std::vector<SafetensorsFile>& files, NameTable& table) {
  const std::string where = "safetensors file " + quoted(file.path()) + ": ";
  json pieces = json::object();
  if (auto it = file.metadata().find(std::string(kPiecesKey)); it != file.metadata().end()) {
    try {
      pieces = json::parse(it->second);
    } catch (const json::exception& e) {
      throw InvalidArgument(where + "__metadata__ '" + std::string(kPiecesKey) + "' is not valid JSON: " + e.what());
    }
    if (!pieces.is_object())
      throw InvalidArgument(where + "__metadata__ '" + std::string(kPiecesKey) + "' is not a JSON object");
  }
  for (const auto& [key, value] : pieces.items()) {
    if (!file.tensors().count(key))
      throw InvalidArgument(where + "tensor '" + key + "': listed in __metadata__ '" + std::string(kPiecesKey) +
                            "' but not in the file");
    if (!value.is_object() || !value.contains("name") || !value["name"].is_string() || !value.contains("shape") ||
        !value["shape"].is_array() || !value.contains("begin") || !value["begin"].is_number_integer() ||
        !value.contains("end") || !value["end"].is_number_integer())
      throw InvalidArgument(where + "tensor '" + key + "': its entry of __metadata__ '" + std::string(kPiecesKey) +
                            "' is not {name, shape, begin, end}");
  }
  for (const auto& [key, info] : file.tensors()) {
    std::string name = key;
    Shape shape = info.shape;
    std::int64_t begin = 0, end = info.shape.numel();
    if (auto p = pieces.find(key); p != pieces.end()) {
      name = (*p)["name"].get<std::string>();
      std::vector<std::int64_t> dims;
      for (const json& d : (*p)["shape"]) {
        if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
          throw InvalidArgument(where + "tensor '" + key + "': piece of '" + name + "' with a bad whole shape " +
                                (*p)["shape"].dump());
        dims.push_back(d.get<std::int64_t>());
      }
      shape = Shape(std::move(dims));
      begin = (*p)["begin"].get<std::int64_t>();
      end = (*p)["end"].get<std::int64_t>();
      if (begin < 0 || begin > end || end > shape.numel())
        throw InvalidArgument(where + "tensor '" + key + "': piece " + range_str(begin, end) + " of '" + name +
                              "' is outside its shape " + shape.str());
      if (info.shape.numel() != end - begin)
        throw InvalidArgument(where + "tensor '" + key + "': piece " + range_str(begin, end) + " of '" + name +
                              "' stored with " + std::to_string(info.shape.numel()) + " elements");
    }
    auto [it, added] = table.try_emplace(name);
    Named& n = it->second;
    if (added) {
      n.dtype = info.dtype;
      n.shape = shape;
    } else if (n.dtype != info.dtype || n.shape != shape) {
      const SafetensorsFile& other = files[static_cast<std::size_t>(n.pieces.front().file)];
      throw InvalidArgument(where + "tensor '" + name + "': " + std::string(safetensors_dtype(info.dtype)) + " " +
                            shape.str() + " here, but " + safetensors_dtype(n.dtype) + " " + n.shape.str() + " in " +
                            quoted(other.path()));
    }
    n.pieces.push_back({index, key, begin, end});
  }
}

// Every name's pieces cover it exactly once.
void check_pieces(const fs::path& where, const std::vector<SafetensorsFile>& files, NameTable& table) {
  for (auto& [name, n] : table) {
    std::sort(n.pieces.begin(), n.pieces.end(),
              [](const Piece& a, const Piece& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
    std::int64_t expected = 0;
    const Piece* previous = nullptr;
    auto file_of = [&](const Piece& p) { return quoted(files[static_cast<std::size_t>(p.file)].path()); };
    for (const Piece& p : n.pieces) {
      if (p.begin == p.end && n.shape.numel() != 0) continue;  // an empty piece holds nothing
      if (p.begin < expected)
        throw InvalidArgument("checkpoint " + quoted(where) + ": tensor '" + name + "': piece " +
                              range_str(p.begin, p.end) + " in " + file_of(p) + " overlaps piece " +
                              range_str(previous->begin, previous->end) + " in " + file_of(*previous));
      if (p.begin > expected)
        throw InvalidArgument("checkpoint " + quoted(where) + ": tensor '" + name + "': elements " +
                              range_str(expected, p.begin) + " of " + n.shape.str() +
                              " are in no piece (a hole before " + file_of(p) + "'s)");
      expected = p.end;
      previous = &p;
    }
    if (expected != n.shape.numel())
      throw InvalidArgument("checkpoint " + quoted(where) + ": tensor '" + name + "': elements " +
                            range_str(expected, n.shape.numel()) + " of " + n.shape.str() + " are in no piece");
  }
}

json index_tensors(const std::vector<SafetensorsFile>& files, const NameTable& table) {
  json tensors = json::object();
  for (const auto& [name, n] : table) {
    json pieces = json::array();
    for (const Piece& p : n.pieces)
      pieces.push_back({{"file", files[static_cast<std::size_t>(p.file)].path().filename().string()},
                        {"key", p.key},
                        {"begin", p.begin},
                        {"end", p.end}});
    tensors[name] = {{"dtype", safetensors_dtype(n.dtype)}, {"shape", n.shape.dims()}, {"pieces", pieces}};
  }
  return tensors;
}

json weight_map(const std::vector<SafetensorsFile>& files, const NameTable& table) {
  json map = json::object();
  for (const auto& [name, n] : table) {
    std::vector<std::string> names;
    for (const Piece& p : n.pieces) {
      std::string f = files[static_cast<std::size_t>(p.file)].path().filename().string();
      if (std::find(names.begin(), names.end(), f) == names.end()) names.push_back(std::move(f));
    }
    if (names.size() == 1) map[name] = names.front();
    else map[name] = names;
  }
  return map;
}

Metadata user_metadata(const Metadata& m) {
  Metadata out;
  for (const auto& [k, v] : m)
    if (!detail::reserved_metadata_key(k)) out.emplace(k, v);
  return out;
}

// ---- the background writer ---------------------------------------------------

struct SaveJob {
  fs::path dir;      // the final name
  fs::path partial;  // where the shards and the index are written: "<dir>.partial"
  SaveOptions options;  // options.save_id set
  Metadata metadata;  // the shard's: the user's and the layer's own keys
  // The snapshots' memory: kept alive by an op that runs after the save's
  // (engine threads free it, never the writer, which must not push).
  struct Item {
    std::string key;
    DType dtype;
    Shape shape;  // as stored
    const weft::detail::Storage* snapshot = nullptr;
  };
  std::vector<Item> items;
  std::string what;  // "checkpoint save 'dir' (rank r of n)"
  std::chrono::steady_clock::time_point deadline;
  std::string waiting_for;  // why the index is not written yet
  std::shared_ptr<std::exception_ptr> outcome;  // the failure, for PendingSave
};

struct Task {
  std::shared_ptr<SaveJob> job;
  Completion done;
};

void finish(Task& task, std::exception_ptr error) {
  task.job->items.clear();
  if (error) *task.job->outcome = error;
  Completion done = std::move(task.done);
  task.job.reset();
  done(std::move(error));
}

// ---- the run directory: partial saves, commits, retention ---------------------

constexpr std::string_view kPartialSuffix = ".partial";
constexpr std::string_view kReplacedSuffix = ".replaced";

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

fs::path with_suffix(const fs::path& dir, std::string_view suffix) {
  fs::path p = dir.lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "a/b/"
  return p.parent_path() / (p.filename().string() + std::string(suffix));
}

fs::path absolute_path(const fs::path& p) { return fs::absolute(p).lexically_normal(); }

// The partial directories this process's saves write into: the cleanup a
// new lock does leaves them alone.
std::mutex registry_mutex;
std::set<fs::path>& own_partials() {
  static std::set<fs::path> set;
  return set;
}

// SaveOptions::save_id when none is given: random for one writer, else a
// hash of what every rank knows alike (FNV-1a).
std::string default_save_id(const fs::path& dir, const SaveOptions& options) {
  char buf[40];
  if (options.ranks == 1) {
    static std::mutex mutex;
    static std::mt19937_64 rng = [] {
      std::random_device device;
      std::seed_seq seq{device(), device(), device(), device(), static_cast<unsigned>(::getpid()),
                        static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count())};
      return std::mt19937_64(seq);
    }();
    std::lock_guard lock(mutex);
    const std::uint64_t a = rng(), b = rng();
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a),
                  static_cast<unsigned long long>(b));
    return buf;
  }
  std::uint64_t h = 14695981039346656037ull;
  auto mix = [&h](std::string_view text) {
    for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;
  };
  mix(dir.filename().string());
  mix(std::to_string(options.ranks));
  for (const auto& [k, v] : options.metadata) {
    mix(k);
    mix(v);
  }
  std::snprintf(buf, sizeof buf, "h%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Rank 0, index written: the partial directory becomes job.dir. An existing
// job.dir (the same step saved again) is swapped with it in one atomic
// exchange, so the name always holds a complete checkpoint; where the file
// system cannot exchange, the old one is moved aside first unless `latest`
// names it.
void commit_directory(SaveJob& job) {
  const fs::path& dir = job.dir;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (!fs::exists(st)) {
    if (::rename(job.partial.c_str(), dir.c_str()) != 0)
      throw Error(job.what + ": renaming " + quoted(job.partial) + " to " + quoted(dir) + ": " + std::strerror(errno));
  } else {
    if (!fs::is_directory(st) || fs::is_symlink(st))
      throw Error(job.what + ": " + quoted(dir) + " exists and is not a checkpoint directory");
    if (::renameat2(AT_FDCWD, job.partial.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
      detail::crash_point("dir-renamed");
      detail::fsync_directory(dir.parent_path());
      detail::crash_point("committed");
      fs::remove_all(job.partial, ec);  // the replaced checkpoint (a leftover the next lock removes)
      return;
    }
    const int err = errno;
    if (err != EINVAL && err != ENOSYS && err != ENOTSUP)
      throw Error(job.what + ": exchanging " + quoted(job.partial) + " with " + quoted(dir) + ": " +
                  std::strerror(err));
    if (!job.options.run_dir.empty()) {
      std::error_code lec;
      const fs::path current = fs::read_symlink(job.options.run_dir / "latest", lec);
      if (!lec && fs::equivalent(job.options.run_dir / current, dir, lec))
        throw Error(job.what + ": " + quoted(dir) + " exists and 'latest' names it; this file system cannot "
                    "exchange two directories atomically, so it is kept: save under another name");
    }
    const fs::path aside = with_suffix(dir, kReplacedSuffix);
    fs::remove_all(aside, ec);
    if (::rename(dir.c_str(), aside.c_str()) != 0)
      throw Error(job.what + ": moving " + quoted(dir) + " aside: " + std::strerror(errno));
    if (::rename(job.partial.c_str(), dir.c_str()) != 0) {
      const int rename_err = errno;
      ::rename(aside.c_str(), dir.c_str());  // the old one back
      throw Error(job.what + ": renaming " + quoted(job.partial) + " to " + quoted(dir) + ": " +
                  std::strerror(rename_err));
    }
    detail::crash_point("dir-renamed");
    detail::fsync_directory(dir.parent_path());
    detail::crash_point("committed");
    fs::remove_all(aside, ec);
    return;
  }
  detail::crash_point("dir-renamed");
  detail::fsync_directory(dir.parent_path());
  detail::crash_point("committed");
}

// Deletes all but the newest `keep` complete checkpoints of run_dir (by
// their index's modification time, then name), never the one `latest`
// names. Each is renamed to "<name>.replaced" before it is removed, so a
// crash mid-delete leaves no half checkpoint under a checkpoint's name.
void apply_retention(const fs::path& run_dir, int keep) {
  std::error_code ec;
  fs::path current;
  try {
    current = fs::canonical(latest(run_dir));
  } catch (const std::exception&) {
    return;  // no latest: nothing is deleted
  }
  struct Found {
    fs::file_time_type time;
    std::string name;
  };
  std::vector<Found> found;
  for (const fs::directory_entry& e : fs::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "latest" || ends_with(name, kPartialSuffix) || ends_with(name, kReplacedSuffix)) continue;
    std::error_code fec;
    if (e.is_symlink(fec) || !e.is_directory(fec)) continue;
    const fs::path index = e.path() / "index.json";
    if (!fs::is_regular_file(index, fec)) continue;
    const fs::file_time_type t = fs::last_write_time(index, fec);
    if (fec) continue;
    found.push_back({t, name});
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return std::tie(a.time, a.name) > std::tie(b.time, b.name); });
  for (std::size_t k = static_cast<std::size_t>(keep); k < found.size(); ++k) {
    const fs::path victim = run_dir / found[k].name;
    std::error_code vec;
    if (fs::equivalent(victim, current, vec)) continue;
    const fs::path aside = with_suffix(victim, kReplacedSuffix);
    fs::remove_all(aside, vec);
    if (::rename(victim.c_str(), aside.c_str()) != 0) continue;  // (gone already, or not ours to move)
    fs::remove_all(aside, vec);
    detail::crash_point("retention-one");
  }
}

// Rank 0: once every shard of this save is durable in the partial
// directory, writes index.json there, renames the directory to its final
// name, fsyncs the parent and, with run_dir, swaps `latest` and applies the
// retention. False while some shard is missing or another save's.
bool try_index(SaveJob& job) {
  const int ranks = job.options.ranks;
  std::vector<SafetensorsFile> files;
  for (int r = 0; r < ranks; ++r) {
    const fs::path shard = job.partial / shard_file_name(r, ranks);
    std::error_code ec;
    if (!fs::exists(shard, ec)) {
      job.waiting_for = "rank " + std::to_string(r) + "'s shard " + quoted(shard) + " is missing";
      return false;
    }
    SafetensorsFile file;
    try {
      file = SafetensorsFile::open(shard);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(job.what + ": rank " + std::to_string(r) + "'s shard: " + e.what());
    }
    const auto id = file.metadata().find(std::string(kSaveIdKey));
    if (id == file.metadata().end() || id->second != job.options.save_id) {
      job.waiting_for = "rank " + std::to_string(r) + "'s shard " + quoted(shard) +
                        " is another save's (left by an earlier one)";
      return false;
    }
    files.push_back(std::move(file));
  }
  detail::crash_point("shards-durable");
  NameTable table;
  for (int r = 0; r < ranks; ++r) collect(files[static_cast<std::size_t>(r)], r, files, table);
  check_pieces(job.dir, files, table);
  const json index = {{"format", "weft.checkpoint"},
                      {"version", 2},
                      {"save_id", job.options.save_id},
                      {"metadata", job.options.metadata},
                      {"ranks", ranks},
                      {"weight_map", weight_map(files, table)},
                      {"tensors", index_tensors(files, table)}};
  detail::write_file_atomically(job.partial / "index.json", index.dump(1) + "\n");
  commit_directory(job);
  if (!job.options.run_dir.empty()) {
    set_latest(job.options.run_dir, job.dir);
    detail::crash_point("latest-swapped");
    apply_retention(job.options.run_dir, job.options.keep);
  }
  return true;
}

// One thread per process, started by the first save and joined at exit:
// shard writes in the order they come, and rank 0's index jobs, which wait
// for the other shards without holding up the writes behind them.
class Writer {
 public:
  static Writer& instance() {
    static Writer writer;
    return writer;
  }
  void submit(Task task) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
  }
  ~Writer() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

 private:
  Writer() : thread_([this] { run(); }) {}

  static constexpr auto kPoll = std::chrono::milliseconds(10);

  void write_shard(Task& task) {
    SaveJob& job = *task.job;
    try {
      fs::create_directories(job.partial);
      std::vector<detail::TensorView> views;
      views.reserve(job.items.size());
      for (const SaveJob::Item& item : job.items) {
        weft::detail::require_values(*item.snapshot, "checkpoint save", "'" + item.key + "'");
        views.push_back({item.key, item.dtype, item.shape, item.snapshot->data(), item.snapshot->bytes});
      }
      detail::write_safetensors_views(job.partial / shard_file_name(job.options.rank, job.options.ranks), views,
                                      job.metadata);
      job.items.clear();
      if (job.options.rank != 0) return finish(task, nullptr);
      job.deadline = std::chrono::steady_clock::now() + job.options.timeout;
      if (try_index(job)) return finish(task, nullptr);
      waiting_.push_back(std::move(task));
    } catch (const fs::filesystem_error& e) {
      finish(task, std::make_exception_ptr(Error(job.what + ": " + e.what())));
    } catch (...) {
      finish(task, std::current_exception());
    }
  }

  // True when the task is finished (index written, failed or timed out).
  bool poll_index(Task& task, bool exiting) {
    SaveJob& job = *task.job;
    try {
      if (try_index(job)) {
        finish(task, nullptr);
        return true;
      }
      if (exiting || std::chrono::steady_clock::now() >= job.deadline) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(job.options.timeout).count();
        finish(task, std::make_exception_ptr(Error(
                         job.what + ": " + (exiting ? "the process exits" : "waited " + std::to_string(ms) + " ms") +
                         " before every shard was written (" + job.waiting_for + "); index.json is not written")));
        return true;
      }
      return false;
    } catch (const fs::filesystem_error& e) {
      finish(task, std::make_exception_ptr(Error(job.what + ": " + e.what())));
    } catch (...) {
      finish(task, std::current_exception());
    }
    return true;
  }

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (!queue_.empty()) {
        Task task = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        write_shard(task);
        lock.lock();
        continue;
      }
      if (!waiting_.empty()) {
        std::vector<Task> tasks = std::move(waiting_);
        waiting_.clear();
        const bool exiting = stop_;
        lock.unlock();
        std::vector<Task> kept;
        for (Task& t : tasks)
          if (!poll_index(t, exiting)) kept.push_back(std::move(t));
        lock.lock();
        for (Task& t : kept) waiting_.push_back(std::move(t));
        if (!waiting_.empty()) wake_.wait_for(lock, kPoll, [this] { return !queue_.empty(); });
        continue;
      }
      if (stop_) return;
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  std::vector<Task> waiting_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace

// ---- PendingSave ------------------------------------------------------------

struct PendingSave::State {
  // A plain Var deleted here, not a SharedVar: a SharedVar's release holds
  // the engine's life lock while the naive engine deletes the variable under
  // its run lock, the order opposite to an op body dropping a SharedVar
  // (collectives' phase variables) under that run lock.
  Engine* engine = nullptr;
  Var var;
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (engine == nullptr || var.is_null()) return;
    try {
      engine->delete_var(var);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "weft: %s: deleting its variable: %s\n", what.c_str(), e.what());
    }
  }
  std::string what;
  std::shared_ptr<std::exception_ptr> outcome = std::make_shared<std::exception_ptr>();
  bool waited = false;
  std::exception_ptr error;  // what wait() found
};

PendingSave::PendingSave(PendingSave&&) noexcept = default;
PendingSave& PendingSave::operator=(PendingSave&& other) noexcept {
  if (this != &other) {
    PendingSave old(std::move(*this));  // waits for the save it held
    state_ = std::move(other.state_);
  }
  return *this;
}

PendingSave::~PendingSave() {
  if (!state_ || state_->waited) return;
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft: %s failed (nobody waited for it): %s\n", state_->what.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "weft: %s failed (nobody waited for it)\n", state_->what.c_str());
  }
}

void PendingSave::wait() {
  if (!state_) return;
  if (!state_->waited) {
    try {
      state_->engine->wait_to_read(state_->var);
    } catch (...) {
      state_->error = std::current_exception();
    }
    state_->waited = true;
    // The engine reports a failure once: the writer's record covers a
    // failure someone else's wait reported first.
    if (!state_->error) state_->error = *state_->outcome;
  }
  if (state_->error) std::rethrow_exception(state_->error);
}

bool PendingSave::done() const {
  return !state_ || state_->waited || state_->engine->version(state_->var) > 0;
}

Var PendingSave::var() const { return state_ ? state_->var : Var(); }

// ---- save ----------------------------------------------------------------------

PendingSave save(Engine& engine, const fs::path& dir, std::vector<Entry> entries, const SaveOptions& options) {
  const std::string what = "checkpoint save " + quoted(dir) + " (rank " + std::to_string(options.rank) + " of " +
                           std::to_string(options.ranks) + ")";
  auto bad = [&](const std::string& m) { throw InvalidArgument(what + ": " + m); };
  if (dir.empty()) bad("no directory given");
  if (options.ranks < 1 || options.rank < 0 || options.rank >= options.ranks)
    bad("rank " + std::to_string(options.rank) + " is not in [0, " + std::to_string(options.ranks) + ")");
  for (const auto& [k, v] : options.metadata)
    if (detail::reserved_metadata_key(k)) bad("metadata key '" + k + "' is reserved for the checkpoint's own use");
  if (options.keep < 1)
    bad("SaveOptions::keep (--keep-checkpoints) is " + std::to_string(options.keep) +
        ": a run directory keeps at least its newest checkpoint (1 or more)");

  struct Resolved {
    const Entry* entry;
    Shape shape;
    std::int64_t begin, end;
  };
  std::vector<Resolved> resolved;
  std::map<std::string, std::vector<std::size_t>> by_name;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.name.empty()) bad("entry #" + std::to_string(i) + " has no name");
    const std::string key = "tensor '" + e.name + "': ";
    if (e.name == "__metadata__") bad(key + "the name is reserved for the metadata");
    if (!e.tensor.defined()) bad(key + "no tensor given (an undefined Tensor)");
    if (&e.tensor.engine() != &engine) bad(key + e.tensor.str() + " belongs to another engine");
    if (!safetensors_dtype(e.tensor.dtype()))
      bad(key + "dtype " + std::string(to_string(e.tensor.dtype())) +
          " cannot be saved (safetensors F32, BF16 and F16 can: float32, bfloat16, float16)");
    Shape shape = e.shape.rank() == 0 ? e.tensor.shape() : e.shape;
    const std::int64_t end = e.end == -1 ? shape.numel() : e.end;
    if (e.begin < 0 || e.begin > end || end > shape.numel())
      bad(key + "piece " + range_str(e.begin, end) + " is outside its shape " + shape.str() + " (" +
          std::to_string(shape.numel()) + " elements)");
    if (e.tensor.numel() != end - e.begin)
      bad(key + e.tensor.str() + " has " + std::to_string(e.tensor.numel()) + " elements for piece " +
          range_str(e.begin, end) + " (" + std::to_string(end - e.begin) + ")");
    by_name[e.name].push_back(resolved.size());
    resolved.push_back({&e, std::move(shape), e.begin, end});
  }
  // One name: one dtype and shape, pieces apart from each other.
  for (auto& [name, list] : by_name) {
    std::sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) {
      return std::tie(resolved[a].begin, resolved[a].end) < std::tie(resolved[b].begin, resolved[b].end);
    });
    for (std::size_t k = 1; k < list.size(); ++k) {
      const Resolved& a = resolved[list[k - 1]];
      const Resolved& b = resolved[list[k]];
      const std::string key = "tensor '" + name + "': ";
      if (a.shape != b.shape || a.entry->tensor.dtype() != b.entry->tensor.dtype())
        bad(key + "given with two shapes or dtypes (" + a.shape.str() + " " +
            std::string(to_string(a.entry->tensor.dtype())) + ", " + b.shape.str() + " " +
            std::string(to_string(b.entry->tensor.dtype())) + ")");
      if (a.begin == b.begin && a.end == b.end) bad(key + "piece " + range_str(a.begin, a.end) + " given twice");
      if (b.begin < a.end && b.begin < b.end)
        bad(key + "pieces " + range_str(a.begin, a.end) + " and " + range_str(b.begin, b.end) + " overlap");
    }
  }

  auto job = std::make_shared<SaveJob>();
  job->dir = dir.lexically_normal();
  if (job->dir.filename().empty()) job->dir = job->dir.parent_path();
  job->partial = with_suffix(job->dir, kPartialSuffix);
  job->options = options;
  if (job->options.save_id.empty()) job->options.save_id = default_save_id(job->dir, options);
  // This save's partial directory is the process's own before the lock's
  // cleanup runs: the other ranks may be writing their shards into it already.
  {
    std::lock_guard registry(registry_mutex);
    own_partials().insert(absolute_path(job->partial));
  }
  if (!options.run_dir.empty() && options.rank == 0) lock_run(options.run_dir);
  job->metadata = options.metadata;
  job->what = what;
  json pieces = json::object();
  std::set<std::string> keys;
  std::vector<Var> reads;
  std::vector<weft::detail::StoragePtr> keep;
  for (const auto& [name, list] : by_name) {
    std::vector<std::size_t> kept;
    for (std::size_t i : list) {
      const Resolved& r = resolved[i];
      const bool whole = r.begin == 0 && r.end == r.shape.numel();
      if (!whole && r.begin == r.end) continue;  // an empty piece holds nothing
      kept.push_back(i);
    }
    for (std::size_t i : kept) {
      const Resolved& r = resolved[i];
      const bool whole = r.begin == 0 && r.end == r.shape.numel();
      const std::string key = kept.size() == 1 ? name : name + "[" + std::to_string(r.begin) + ":" + std::to_string(r.end) + "]";
      if (!keys.insert(key).second) bad("tensor '" + name + "': its key '" + key + "' is another tensor's name");
      if (!whole) pieces[key] = {{"name", name}, {"shape", r.shape.dims()}, {"begin", r.begin}, {"end", r.end}};
      // The snapshot: a copy ordered after the writes pushed before (GPU
      // memory comes to page-locked host memory in one copy).
      // A channels_last tensor is written in its logical NCHW order, as
      // safetensors readers expect: converted first (one op on its device).
      const Tensor t = r.entry->tensor.memory_format() == MemoryFormat::channels_last
                           ? ops::contiguous(r.entry->tensor)
                           : r.entry->tensor;
      const Device to = t.device().is_gpu() ? Device::cpu_pinned(0) : t.device();
      Tensor snapshot = t.copy_to(to);
      reads.push_back(snapshot.var());
      job->items.push_back({key, t.dtype(), whole ? r.shape : Shape{r.end - r.begin}, snapshot.storage().get()});
      keep.push_back(snapshot.storage());
    }
  }
  if (!pieces.empty()) job->metadata[std::string(kPiecesKey)] = pieces.dump();
  job->metadata[std::string(kSaveIdKey)] = job->options.save_id;
  job->metadata[std::string(kRankKey)] = std::to_string(options.rank);
  job->metadata[std::string(kRanksKey)] = std::to_string(options.ranks);

  PendingSave pending;
  pending.state_ = std::make_shared<PendingSave::State>();
  PendingSave::State& state = *pending.state_;
  state.engine = &engine;
  state.var = engine.new_var(what);
  state.what = what;
  job->outcome = state.outcome;
  // Duplicated reads (one tensor saved twice) are fine: the engine ignores them.
  engine.push_async(
      [job](RunContext& ctx, Completion done) mutable {
        for (const SaveJob::Item& item : job->items) weft::detail::require_memory(*item.snapshot, ctx.op_name);
        Writer::instance().submit(Task{std::move(job), std::move(done)});
      },
      Device::cpu(0), reads, {state.var}, {.name = what, .run_inline = true});
  // The snapshots are freed by this op, once the files are written.
  engine.push([keep = std::move(keep)] {}, Device::cpu(0), {state.var}, {},
              {.name = what + ": free the snapshots"});
  return pending;
}

// ---- Reader ------------------------------------------------------------------

struct Reader::Impl {
  fs::path path;
  bool directory = false;
  Metadata metadata;
  int ranks = 1;
  std::vector<SafetensorsFile> files;
  NameTable names;

  [[noreturn]] void bad(const std::string& name, const std::string& m) const {
    throw InvalidArgument("checkpoint " + quoted(path) + ": tensor '" + name + "': " + m);
  }
  const Named& named(const std::string& name) const {
    const auto it = names.find(name);
    if (it == names.end()) bad(name, "not in the checkpoint");
    return it->second;
  }
};

Reader::Reader() : impl_(std::make_unique<Impl>()) {}
Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;
Reader::~Reader() = default;

namespace {

// index.json's "tensors" against what the shards' headers say.
void check_index(const fs::path& index_file, const json& index, const std::vector<SafetensorsFile>& files,
                 const NameTable& table) {
  const std::string where = "checkpoint index " + quoted(index_file) + ": ";
  const json want = index_tensors(files, table);
  const json& got = index["tensors"];
  for (const auto& [name, value] : got.items())
    if (!want.contains(name))
      throw InvalidArgument(where + "tensor '" + name + "': in the index but in none of its shards");
  for (const auto& [name, value] : want.items()) {
    if (!got.contains(name))
      throw InvalidArgument(where + "tensor '" + name + "': in the shards but not in the index");
    if (got[name] != value)
      throw InvalidArgument(where + "tensor '" + name + "': the index says " + got[name].dump() +
                            " but the shards hold " + value.dump());
  }
  if (index["weight_map"] != weight_map(files, table))
    throw InvalidArgument(where + "its \"weight_map\" does not match the shards' headers");
}

}  // namespace

Reader Reader::open(const fs::path& path) {
  Reader reader;
  Impl& impl = *reader.impl_;
  impl.path = path;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) throw InvalidArgument("checkpoint " + quoted(path) + ": no such file or directory");
  if (!fs::is_directory(status)) {
    impl.files.push_back(SafetensorsFile::open(path));
    impl.metadata = user_metadata(impl.files.front().metadata());
    collect(impl.files.front(), 0, impl.files, impl.names);
    check_pieces(path, impl.files, impl.names);
    return reader;
  }
  impl.directory = true;
  const fs::path index_file = path / "index.json";
  // The directory stays open and every file is opened relative to it: a
  // directory renamed or exchanged meanwhile (a save of the same name) can
  // not mix another checkpoint's files into this one.
  struct DirFd {
    int fd;
    ~DirFd() {
      if (fd >= 0) ::close(fd);
    }
  } dir{::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd < 0) throw InvalidArgument("checkpoint " + quoted(path) + ": cannot open it: " + std::strerror(errno));
  const std::string where = "checkpoint index " + quoted(index_file) + ": ";
  json index;
  {
    const int fd = ::openat(dir.fd, "index.json", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT)
        throw InvalidArgument("checkpoint " + quoted(path) +
                              ": no index.json (not a checkpoint directory, or its save did not finish)");
      throw InvalidArgument(where + "cannot open it: " + std::strerror(errno));
    }
    std::string text;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        throw InvalidArgument(where + "cannot read it: " + std::strerror(err));
      }
      if (n == 0) break;
      text.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    std::string duplicate;
    try {
      index = detail::parse_unique_keys(text, duplicate);
    } catch (const json::exception& e) {
      throw InvalidArgument(where + "invalid JSON: " + e.what());
    }
    if (!duplicate.empty())
      throw InvalidArgument(where + "key '" + duplicate + "' appears twice (which one counts is ambiguous)");
  }
  if (!index.is_object()) throw InvalidArgument(where + "not a JSON object");
  if (!index.contains("ranks") || !index["ranks"].is_number_integer() || index["ranks"].get<std::int64_t>() < 1 ||
      index["ranks"].get<std::int64_t>() > 99999)
    throw InvalidArgument(where + "key 'ranks': missing or not a count of writers");
  if (!index.contains("metadata") || !index["metadata"].is_object())
    throw InvalidArgument(where + "key 'metadata': missing or not an object");
  for (const auto& [k, v] : index["metadata"].items()) {
    if (!v.is_string()) throw InvalidArgument(where + "key 'metadata': '" + k + "' is not a string");
    impl.metadata[k] = v.get<std::string>();
  }
  if (!index.contains("tensors") || !index["tensors"].is_object())
    throw InvalidArgument(where + "key 'tensors': missing or not an object");
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    throw InvalidArgument(where + "key 'weight_map': missing or not an object");
  // Version 2 names its save: every shard must carry the same identity.
  std::optional<std::string> save_id;
  if (index.contains("save_id")) {
    if (!index["save_id"].is_string() || index["save_id"].get<std::string>().empty())
      throw InvalidArgument(where + "key 'save_id': not a save's identity (a non-empty string)");
    save_id = index["save_id"].get<std::string>();
  } else if (index.value("version", 1) >= 2) {
    throw InvalidArgument(where + "key 'save_id': missing (a version 2 index names its save)");
  }
  impl.ranks = index["ranks"].get<int>();
  for (int r = 0; r < impl.ranks; ++r) {
    const std::string name = shard_file_name(r, impl.ranks);
    const fs::path shard = path / name;
    struct stat st {};
    if (::fstatat(dir.fd, name.c_str(), &st, 0) != 0 && errno == ENOENT)
      throw InvalidArgument("checkpoint " + quoted(path) + ": the shard of rank " + std::to_string(r) + ", " +
                            quoted(shard) + ", is missing");
    try {
      impl.files.push_back(detail::open_safetensors_at(dir.fd, name, shard));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("checkpoint " + quoted(path) + ": the shard of rank " + std::to_string(r) + ": " +
                            e.what());
    }
    const Metadata& m = impl.files.back().metadata();
    const auto rank_it = m.find(std::string(kRankKey));
    const auto ranks_it = m.find(std::string(kRanksKey));
    if (rank_it == m.end() || ranks_it == m.end() || rank_it->second != std::to_string(r) ||
        ranks_it->second != std::to_string(impl.ranks))
      throw InvalidArgument("checkpoint " + quoted(path) + ": the shard of rank " + std::to_string(r) + ", " +
                            quoted(shard) + ", was not written as rank " + std::to_string(r) + " of " +
                            std::to_string(impl.ranks));
    if (save_id) {
      const auto id = m.find(std::string(kSaveIdKey));
      if (id == m.end() || id->second != *save_id)
        throw InvalidArgument("checkpoint " + quoted(path) + ": the shard of rank " + std::to_string(r) + ", " +
                              quoted(shard) + ", belongs to another checkpoint: its __metadata__ key '" +
                              std::string(kSaveIdKey) + "' is " +
                              (id == m.end() ? std::string("missing") : "'" + id->second + "'") + ", but index " +
                              quoted(index_file) + " is of save '" + *save_id + "'");
    }
  }
  for (int r = 0; r < impl.ranks; ++r) collect(impl.files[static_cast<std::size_t>(r)], r, impl.files, impl.names);
  check_pieces(path, impl.files, impl.names);
  check_index(index_file, index, impl.files, impl.names);
  return reader;
}

const fs::path& Reader::path() const noexcept { return impl_->path; }
const Metadata& Reader::metadata() const noexcept { return impl_->metadata; }
int Reader::ranks() const noexcept { return impl_->ranks; }

std::vector<std::string> Reader::names() const {
  std::vector<std::string> out;
  out.reserve(impl_->names.size());
  for (const auto& [name, n] : impl_->names) out.push_back(name);
  return out;
}
bool Reader::has(const std::string& name) const { return impl_->names.count(name) > 0; }
Shape Reader::shape(const std::string& name) const { return impl_->named(name).shape; }
DType Reader::dtype(const std::string& name) const { return impl_->named(name).dtype; }

std::vector<std::byte> Reader::read(const std::string& name, std::int64_t begin, std::int64_t end) const {
  const Named& n = impl_->named(name);
  if (end == -1) end = n.shape.numel();
  if (begin < 0 || begin > end || end > n.shape.numel())
    impl_->bad(name, "elements " + range_str(begin, end) + " asked of " + n.shape.str());
  const std::uint64_t es = dtype_size(n.dtype);
  std::vector<std::byte> out;
  out.reserve(static_cast<std::size_t>(end - begin) * es);
  for (const Piece& p : n.pieces) {
    const std::int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.end);
    if (lo >= hi) continue;
    const std::vector<std::byte> part = impl_->files[static_cast<std::size_t>(p.file)].read(
        p.key, static_cast<std::uint64_t>(lo - p.begin) * es, static_cast<std::uint64_t>(hi - p.begin) * es);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

// ---- load ----------------------------------------------------------------------

namespace {

// Pushes the write of `bytes` (the tensor's whole data) into `target`.
void push_bytes(Tensor& target, std::vector<std::byte> bytes, const std::string& name) {
  using weft::detail::Body;
  if (target.memory_format() != MemoryFormat::contiguous) {
    // The file holds NCHW order: written into a contiguous tensor, converted into the target.
    Tensor staging = Tensor::wrap(std::make_shared<weft::detail::Storage>(target.engine(), target.device(),
                                                                          target.dtype(), target.nbytes(), ""),
                                  target.shape());
    push_bytes(staging, std::move(bytes), name);
    target.copy_from(ops::to_memory_format(staging, target.memory_format()));
    return;
  }
  using weft::detail::OpIO;
  const std::string op = "checkpoint load '" + name + "'";
  const std::uint64_t n = bytes.size();
  auto body = [bytes = std::move(bytes)](RunContext&, OpIO& io) {
    if (!bytes.empty()) std::memcpy(io.out[0], bytes.data(), bytes.size());
  };
  if (!target.device().is_gpu()) {
    weft::detail::launch(op, weft::detail::exec_device(target.device()), {}, {&target}, std::move(body),
                         OpProperty::normal, n, Body::bytes);
    return;
  }
  // GPU memory: through page-locked host memory, one copy.
  Tensor staging = Tensor::wrap(std::make_shared<weft::detail::Storage>(target.engine(), Device::cpu_pinned(0),
                                                                        target.dtype(), target.nbytes(), ""),
                                target.shape());
  weft::detail::launch(op, Device::cpu(0), {}, {&staging}, std::move(body), OpProperty::normal, n, Body::bytes);
  target.copy_from(staging);
}

}  // namespace

void load(const Reader& reader, const std::vector<Entry>& entries, const LoadOptions& options) {
  const std::string where = "checkpoint " + quoted(reader.path());
  auto bad = [&](const std::string& name, const std::string& m) {
    throw InvalidArgument(where + ": tensor '" + name + "': " + m);
  };
  struct Plan {
    Tensor tensor;
    std::string name;
    std::int64_t begin, end;
  };
  std::vector<Plan> plans;
  std::set<std::string> wanted;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.name.empty()) throw InvalidArgument(where + ": load entry #" + std::to_string(i) + " has no name");
    if (!e.tensor.defined()) bad(e.name, "no tensor to load into (an undefined Tensor)");
    if (!reader.has(e.name)) bad(e.name, "the model's tensor is not in the checkpoint");
    const Shape shape = e.shape.rank() == 0 ? e.tensor.shape() : e.shape;
    const Shape saved = reader.shape(e.name);
    if (shape != saved) bad(e.name, "shape " + saved.str() + " in the checkpoint, " + shape.str() + " in the model");
    const DType dtype = reader.dtype(e.name);
    if (e.tensor.dtype() != dtype)
      bad(e.name, "dtype " + std::string(to_string(dtype)) + " in the checkpoint, " +
                      std::string(to_string(e.tensor.dtype())) + " in the model (" + e.tensor.str() + ")");
    const std::int64_t end = e.end == -1 ? shape.numel() : e.end;
    if (e.begin < 0 || e.begin > end || end > shape.numel())
      bad(e.name, "piece " + range_str(e.begin, end) + " is outside its shape " + shape.str());
    if (e.tensor.numel() != end - e.begin)
      bad(e.name, e.tensor.str() + " has " + std::to_string(e.tensor.numel()) + " elements for piece " +
                      range_str(e.begin, end));
    wanted.insert(e.name);
    plans.push_back({e.tensor, e.name, e.begin, end});
  }
  if (options.strict)
    for (const std::string& name : reader.names())
      if (!wanted.count(name)) bad(name, "in the checkpoint but not in the model (a strict load takes every tensor)");
  // Every byte is read before any tensor is written.
  std::vector<std::vector<std::byte>> data;
  data.reserve(plans.size());
  for (const Plan& p : plans) data.push_back(reader.read(p.name, p.begin, p.end));
  for (std::size_t i = 0; i < plans.size(); ++i) push_bytes(plans[i].tensor, std::move(data[i]), plans[i].name);
}

// ---- latest --------------------------------------------------------------------

fs::path latest(const fs::path& run_dir) {
  const fs::path link = run_dir / "latest";
  std::error_code ec;
  const fs::file_status s = fs::symlink_status(link, ec);
  if (!fs::exists(s))
    throw InvalidArgument("checkpoint run directory " + quoted(run_dir) + ": no checkpoint yet (no " +
                          quoted(link) + ")");
  if (!fs::is_symlink(s)) return link;
  const fs::path target = fs::read_symlink(link, ec);
  if (ec) throw InvalidArgument("checkpoint run directory " + quoted(run_dir) + ": cannot read " + quoted(link));
  const fs::path resolved = (target.is_absolute() ? target : run_dir / target).lexically_normal();
  if (!fs::exists(resolved, ec))
    throw InvalidArgument("checkpoint run directory " + quoted(run_dir) + ": " + quoted(link) + " points at " +
                          quoted(resolved) + ", which is missing");
  return resolved;
}

void set_latest(const fs::path& run_dir, const fs::path& checkpoint_dir) {
  const std::string what = "checkpoint run directory " + quoted(run_dir) + ": pointing 'latest' at " +
                           quoted(checkpoint_dir);
  try {
    fs::create_directories(run_dir);
    const fs::path base = fs::weakly_canonical(fs::absolute(run_dir));
    const fs::path dest = fs::weakly_canonical(fs::absolute(checkpoint_dir));
    fs::path target = dest.lexically_relative(base);
    if (target.empty()) target = dest;
    static std::atomic<unsigned> counter{0};
    const fs::path tmp = run_dir / (".latest.tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++));
    fs::remove(tmp);
    fs::create_directory_symlink(target, tmp);
    detail::crash_point("latest-link-made");
    std::error_code ec;
    fs::rename(tmp, run_dir / "latest", ec);
    if (ec) {
      fs::remove(tmp);
      throw Error(what + ": " + ec.message() + " (is 'latest' a directory of its own?)");
    }
    detail::fsync_directory(run_dir);
  } catch (const fs::filesystem_error& e) {
    throw Error(what + ": " + e.what());
  }
}

void lock_run(const fs::path& run_dir) {
  const std::string where = "checkpoint run directory " + quoted(run_dir);
  static std::mutex mutex;
  static std::map<fs::path, int> held;  // this process's locks (kept open until it exits)
  std::lock_guard lock(mutex);
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw Error(where + ": cannot create it: " + ec.message());
  const fs::path key = fs::weakly_canonical(absolute_path(run_dir), ec);
  if (held.count(key)) return;
  const fs::path file = run_dir / "lock";
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(where + ": cannot open its lock file " + quoted(file) + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string owner(256, '\0');
    const ssize_t n = ::pread(fd, owner.data(), owner.size(), 0);
    owner.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!owner.empty() && (owner.back() == '\n' || owner.back() == ' ')) owner.pop_back();
    ::close(fd);
    if (err == EWOULDBLOCK)
      throw InvalidArgument(where + " is being written by another live job: " +
                            (owner.empty() ? std::string("(an owner that has not written its name yet)") : owner) +
                            " holds its lock file " + quoted(file));
    throw Error(where + ": cannot lock " + quoted(file) + ": " + std::strerror(err));
  }
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  const std::string text = "host " + std::string(host) + " pid " + std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()) ||
      ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(where + ": writing its lock file " + quoted(file) + ": " + std::strerror(err));
  }
  held.emplace(key, fd);
  // What crashed saves left: partial and set-aside directories, links.
  std::set<fs::path> own;
  {
    std::lock_guard registry(registry_mutex);
    own = own_partials();
  }
  for (const fs::directory_entry& e : fs::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code rec;
    if ((ends_with(name, kPartialSuffix) || ends_with(name, kReplacedSuffix)) && !own.count(absolute_path(e.path())))
      fs::remove_all(e.path(), rec);
    else if (name.rfind(".latest.tmp.", 0) == 0)
      fs::remove(e.path(), rec);
  }
}

}  // namespace weft::checkpoint
