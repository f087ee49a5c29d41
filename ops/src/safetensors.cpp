// The safetensors file format: writing (atomically) and parsing with every
// check a loader needs before it trusts the offsets. Layout and checks:
// docs/design/checkpoints.md.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checkpoint_io.h"
#include "weft/checkpoint.h"
#include "weft/error.h"

namespace weft::checkpoint {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian: so is this host");

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Larger headers are refused (the format's own limit).
constexpr std::uint64_t kMaxHeader = std::uint64_t{100} << 20;

std::string quoted(const fs::path& p) {
  std::string s = "'";
  s += p.string();
  s += '\'';
  return s;
}

[[noreturn]] void bad_file(const fs::path& file, const std::string& what) {
  throw InvalidArgument("safetensors file " + quoted(file) + ": " + what);
}
[[noreturn]] void bad_tensor(const fs::path& file, const std::string& key, const std::string& what) {
  bad_file(file, "tensor '" + key + "': " + what);
}

[[noreturn]] void io_error(const std::string& what, const fs::path& file, int err) {
  throw Error("checkpoint: " + what + " " + quoted(file) + ": " + std::strerror(err));
}

// Closes on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, std::size_t n, const fs::path& file) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      io_error("writing", file, errno);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

void detail::fsync_directory(const fs::path& dir) {
  Fd d{::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) io_error("opening directory", dir, errno);
  if (::fsync(d.fd) != 0 && errno != EINVAL) io_error("syncing directory", dir, errno);
}

namespace {

// Writes the chunks to file.tmp, syncs, renames over `file`, syncs the
// directory. The temporary file is removed when anything fails, so `file`
// is either the old one or the whole new one.
void write_atomically(const fs::path& file, const std::vector<std::pair<const void*, std::size_t>>& chunks) {
  fs::path tmp = file;
  tmp += ".tmp";
  Fd out{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (out.fd < 0) io_error("creating", tmp, errno);
  try {
    for (const auto& [data, n] : chunks)
      if (n) write_all(out.fd, data, n, tmp);
    if (::fsync(out.fd) != 0) io_error("syncing", tmp, errno);
    const int fd = std::exchange(out.fd, -1);
    if (::close(fd) != 0) io_error("closing", tmp, errno);
    detail::crash_point("file-synced");
    if (::rename(tmp.c_str(), file.c_str()) != 0) io_error("renaming " + quoted(tmp) + " to", file, errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  detail::fsync_directory(file.parent_path());
  detail::crash_point("file-renamed");
}

bool checked_numel(const std::vector<std::int64_t>& dims, std::uint64_t& numel) {
  numel = 1;
  for (std::int64_t d : dims) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel)) return false;
  }
  return true;
}

}  // namespace

const char* safetensors_dtype(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return "F32";
    case DType::bfloat16: return "BF16";
    case DType::float16: return "F16";
    default: return nullptr;
  }
}

std::optional<DType> dtype_from_safetensors(std::string_view name) noexcept {
  if (name == "F32") return DType::float32;
  if (name == "BF16") return DType::bfloat16;
  if (name == "F16") return DType::float16;
  return std::nullopt;
}

namespace detail {

namespace {
std::mutex crash_mutex;
std::string crash_at;  // empty: never
int crash_count = 0;
}  // namespace

void set_crash_point(std::string_view point, int nth) {
  std::lock_guard lock(crash_mutex);
  crash_at = point;
  crash_count = nth;
}

void crash_point(std::string_view point) {
  {
    std::lock_guard lock(crash_mutex);
    if (crash_at.empty() || point != crash_at || --crash_count > 0) return;
  }
  ::kill(::getpid(), SIGKILL);
  for (;;) ::pause();
}

void write_file_atomically(const fs::path& file, std::string_view text) {
  write_atomically(file, {{text.data(), text.size()}});
}

void write_safetensors_views(const fs::path& file, const std::vector<TensorView>& tensors, const Metadata& metadata) {
  json header = json::object();
  std::uint64_t offset = 0;
  std::set<std::string> seen;
  for (const TensorView& t : tensors) {
    if (t.name.empty()) bad_file(file, "a tensor without a name");
    if (t.name == "__metadata__") bad_tensor(file, t.name, "the name is reserved for the metadata");
    if (!seen.insert(t.name).second) bad_tensor(file, t.name, "given twice");
    const char* dtype = safetensors_dtype(t.dtype);
    if (!dtype)
      bad_tensor(file, t.name,
                 "dtype " + std::string(to_string(t.dtype)) + " has no safetensors name here (F32, BF16, F16 do)");
    const auto want = static_cast<std::uint64_t>(t.shape.numel()) * dtype_size(t.dtype);
    if (t.bytes != want)
      bad_tensor(file, t.name,
                 std::to_string(t.bytes) + " bytes given for shape " + t.shape.str() + " of " + dtype + " (" +
                     std::to_string(want) + " bytes)");
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape.dims()}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // a name or value that is not UTF-8
    bad_file(file, std::string("cannot write the header: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::uint64_t n = text.size();  // little-endian (asserted above)
  std::vector<std::pair<const void*, std::size_t>> chunks{{&n, sizeof n}, {text.data(), text.size()}};
  for (const TensorView& t : tensors) chunks.emplace_back(t.data, t.bytes);
  write_atomically(file, chunks);
}

}  // namespace detail

void write_safetensors(const fs::path& file, const std::vector<HostTensor>& tensors, const Metadata& metadata) {
  std::vector<detail::TensorView> views;
  views.reserve(tensors.size());
  for (const HostTensor& t : tensors) views.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  detail::write_safetensors_views(file, views, metadata);
}

// The open file a SafetensorsFile validated: every later read goes through
// it, so a file replaced or renamed over since is never read at the old
// file's offsets.
struct SafetensorsFile::Handle {
  int fd = -1;
  explicit Handle(int f) : fd(f) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (fd >= 0) ::close(fd);
  }
};

SafetensorsFile SafetensorsFile::open(const fs::path& file) { return detail::open_safetensors_at(AT_FDCWD, file, file); }

namespace detail {

json parse_unique_keys(const std::string& text, std::string& duplicate) {
  // One set of keys per object being parsed, with the key that holds it.
  std::vector<std::pair<std::string, std::set<std::string>>> objects;
  std::string last_key;
  duplicate.clear();
  json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: objects.emplace_back(last_key, std::set<std::string>{}); break;
      case json::parse_event_t::object_end:
        if (!objects.empty()) objects.pop_back();
        break;
      case json::parse_event_t::key:
        last_key = parsed.get<std::string>();
        if (!objects.empty() && !objects.back().second.insert(last_key).second && duplicate.empty())
          duplicate = objects.size() > 1 ? objects.back().first + "' key '" + last_key : last_key;
        break;
      default: break;
    }
    return true;
  };
  return json::parse(text, check);
}

SafetensorsFile open_safetensors_at(int dir_fd, const fs::path& name, const fs::path& file) {
  const int opened = ::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC);
  if (opened < 0) {
    const int err = errno;
    if (err == ENOENT) bad_file(file, "no such file");
    throw InvalidArgument("safetensors file " + quoted(file) + ": cannot open it: " + std::strerror(err));
  }
  auto handle = std::make_shared<SafetensorsFile::Handle>(opened);
  const int fd = handle->fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0) io_error("reading the size of", file, errno);
  if (S_ISDIR(st.st_mode)) bad_file(file, "a directory, not a file");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8)
    bad_file(file, "truncated: " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  std::uint64_t n = 0;
  if (::pread(fd, &n, 8, 0) != 8) io_error("reading", file, errno);
  if (n > size - 8)
    bad_file(file, "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size) +
                       " bytes: truncated or not a safetensors file)");
  if (n > kMaxHeader) bad_file(file, "header length " + std::to_string(n) + " is over the format's 100 MB");
  std::string text(n, '\0');
  if (n && ::pread(fd, text.data(), n, 8) != static_cast<ssize_t>(n)) io_error("reading", file, errno);

  json header;
  std::string duplicate;
  try {
    header = parse_unique_keys(text, duplicate);
  } catch (const json::exception& e) {
    bad_file(file, std::string("invalid JSON header: ") + e.what());
  }
  if (!duplicate.empty())
    bad_file(file, "key '" + duplicate + "' appears twice in the header (which one holds the data is ambiguous)");
  if (!header.is_object()) bad_file(file, "the JSON header is not an object");

  SafetensorsFile f;
  f.path_ = file;
  f.handle_ = handle;
  f.data_start_ = 8 + n;
  const std::uint64_t data_size = size - f.data_start_;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) bad_tensor(file, key, "is not an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) bad_file(file, "__metadata__ '" + k + "' is not a string");
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!value.is_object()) bad_tensor(file, key, "its entry is not an object");
    const auto dtype_it = value.find("dtype");
    const auto shape_it = value.find("shape");
    const auto offsets_it = value.find("data_offsets");
    if (dtype_it == value.end() || !dtype_it->is_string()) bad_tensor(file, key, "no \"dtype\" string");
    if (shape_it == value.end() || !shape_it->is_array()) bad_tensor(file, key, "no \"shape\" array");
    if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned())
      bad_tensor(file, key, "no \"data_offsets\" pair of non-negative integers");
    const std::string dtype_name = dtype_it->get<std::string>();
    const std::optional<DType> dtype = dtype_from_safetensors(dtype_name);
    if (!dtype) bad_tensor(file, key, "dtype '" + dtype_name + "' is not supported (F32, BF16, F16 are)");
    std::vector<std::int64_t> dims;
    for (const json& d : *shape_it) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
        bad_tensor(file, key, "shape " + shape_it->dump() + " is not a list of non-negative integers");
      dims.push_back(d.get<std::int64_t>());
    }
    std::uint64_t numel = 0;
    if (!checked_numel(dims, numel) || numel > (std::uint64_t{1} << 60))
      bad_tensor(file, key, "shape " + shape_it->dump() + " is too large");
    SafetensorsFile::Info info;
    info.dtype = *dtype;
    info.shape = Shape(std::move(dims));
    info.begin = (*offsets_it)[0].get<std::uint64_t>();
    info.end = (*offsets_it)[1].get<std::uint64_t>();
    const std::string range = "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
    if (info.begin > info.end) bad_tensor(file, key, range + " end before they begin");
    if (info.end > data_size)
      bad_tensor(file, key,
                 range + " run past the end of the data (" + std::to_string(data_size) + " bytes after the header)");
    const std::uint64_t want = numel * dtype_size(*dtype);
    if (info.end - info.begin != want)
      bad_tensor(file, key,
                 range + " hold " + std::to_string(info.end - info.begin) + " bytes but shape " + info.shape.str() +
                     " of " + dtype_name + " needs " + std::to_string(want));
    f.tensors_.emplace(key, std::move(info));
  }
  // The data: the tensors back to back, from the first byte to the last.
  std::vector<std::tuple<std::uint64_t, std::uint64_t, const std::string*>> spans;
  for (const auto& [key, info] : f.tensors_) spans.emplace_back(info.begin, info.end, &key);
  std::sort(spans.begin(), spans.end());
  std::uint64_t expected = 0;
  const std::string* previous = nullptr;
  for (const auto& [begin, end, key] : spans) {
    if (begin < expected)
      bad_tensor(file, *key,
                 "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] overlap tensor '" +
                     *previous + "'s (which ends at " + std::to_string(expected) + ")");
    if (begin > expected)
      bad_tensor(file, *key,
                 "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] leave bytes [" +
                     std::to_string(expected) + ", " + std::to_string(begin) +
                     ") of the data to no tensor (the data must be contiguous)");
    expected = end;
    previous = key;
  }
  if (expected != data_size)
    bad_file(file, std::to_string(data_size - expected) + " bytes after the last tensor's data belong to no tensor" +
                       (previous ? " (the last is '" + *previous + "')" : std::string()));
  return f;
}

}  // namespace detail

std::vector<std::byte> SafetensorsFile::read(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) bad_tensor(path_, name, "not in the file");
  return read(name, 0, it->second.end - it->second.begin);
}

std::vector<std::byte> SafetensorsFile::read(const std::string& name, std::uint64_t first, std::uint64_t end) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) bad_tensor(path_, name, "not in the file");
  const Info& info = it->second;
  if (first > end || end > info.end - info.begin)
    bad_tensor(path_, name,
               "bytes [" + std::to_string(first) + ", " + std::to_string(end) + ") asked of its " +
                   std::to_string(info.end - info.begin));
  std::vector<std::byte> out(end - first);
  if (out.empty()) return out;
  // Through the descriptor open() validated, never the path again.
  std::size_t done = 0;
  const auto at = static_cast<off_t>(data_start_ + info.begin + first);
  while (done < out.size()) {
    const ssize_t r = ::pread(handle_->fd, out.data() + done, out.size() - done, at + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) io_error("reading", path_, errno);
    if (r == 0) bad_tensor(path_, name, "the file ends inside its data (truncated since it was opened)");
    done += static_cast<std::size_t>(r);
  }
  return out;
}

}  // namespace weft::checkpoint
