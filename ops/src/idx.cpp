// IDX reader: plain files through stdio, gzip files through zlib's gz* API.
#include "weft/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "weft/error.h"

namespace weft {
namespace {

constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 34;  // 16 GiB

[[noreturn]] void idx_fail(const std::string& path, const std::string& what) {
  throw Error("weft::read_idx: " + path + ": " + what);
}

std::string dims_text(const std::vector<std::int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

const char* type_name(unsigned t) {
  switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return nullptr;
  }
}

std::string hex2(unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", v & 0xFFu);
  return buf;
}

// A byte source: read() returns how many bytes it got (fewer only at the end
// of the data) and throws on a read error or a corrupt stream.
class Source {
 public:
  virtual ~Source() = default;
  virtual std::size_t read(void* dst, std::size_t n) = 0;
  // Why the last short read was short, for the "truncated" message ("" if the
  // data simply ended).
  virtual std::string short_reason() { return ""; }
};

class PlainSource final : public Source {
 public:
  PlainSource(const std::string& path, std::FILE* f) : path_(path), f_(f) {}
  ~PlainSource() override { std::fclose(f_); }
  std::size_t read(void* dst, std::size_t n) override {
    std::size_t got = std::fread(dst, 1, n, f_);
    if (got < n && std::ferror(f_)) idx_fail(path_, std::string("read error: ") + std::strerror(errno));
    return got;
  }

 private:
  std::string path_;
  std::FILE* f_;
};

// gzerror's text without the "<path>: " that zlib puts in front.
std::string zlib_message(const std::string& path, const char* msg) {
  std::string m = msg ? msg : "unknown error";
  if (m.rfind(path + ": ", 0) == 0) m.erase(0, path.size() + 2);
  return m;
}

class GzipSource final : public Source {
 public:
  GzipSource(const std::string& path, gzFile f) : path_(path), f_(f) {}
  ~GzipSource() override { gzclose(f_); }
  std::size_t read(void* dst, std::size_t n) override {
    auto* out = static_cast<unsigned char*>(dst);
    std::size_t total = 0;
    while (total < n) {
      unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - total, std::size_t{1} << 30));
      int got = gzread(f_, out + total, chunk);
      if (got < 0) {
        int errnum = 0;
        const char* msg = gzerror(f_, &errnum);
        if (errnum == Z_ERRNO) idx_fail(path_, std::string("read error: ") + std::strerror(errno));
        idx_fail(path_, "corrupt gzip stream (zlib: " + zlib_message(path_, msg) + ")");
      }
      total += static_cast<std::size_t>(got);
      if (static_cast<unsigned>(got) < chunk) break;
    }
    return total;
  }
  std::string short_reason() override {
    int errnum = 0;
    const char* msg = gzerror(f_, &errnum);
    if (errnum == Z_OK) return "";
    return " (the gzip stream is cut short, zlib: " + zlib_message(path_, msg) + ")";
  }

 private:
  std::string path_;
  gzFile f_;
};

std::string hex_magic(const unsigned char* m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%02X%02X%02X%02X", m[0], m[1], m[2], m[3]);
  return buf;
}

std::unique_ptr<Source> open_source(const std::string& path, bool& gzip) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) idx_fail(path, "is a directory, not an IDX file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    int e = errno;
    idx_fail(path, e == ENOENT ? std::string("missing file (no such file)") : std::string("cannot open: ") + std::strerror(e));
  }
  unsigned char head[2] = {0, 0};
  std::size_t got = std::fread(head, 1, 2, f);
  gzip = got == 2 && head[0] == 0x1f && head[1] == 0x8b;
  if (!gzip) {
    std::rewind(f);
    return std::make_unique<PlainSource>(path, f);
  }
  std::fclose(f);
  gzFile g = gzopen(path.c_str(), "rb");
  if (!g) idx_fail(path, std::string("cannot open as gzip: ") + std::strerror(errno));
  gzbuffer(g, 1u << 18);
  return std::make_unique<GzipSource>(path, g);
}

std::uint32_t be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  bool gzip = false;
  std::unique_ptr<Source> src = open_source(path, gzip);
  const std::string what = gzip ? "decompressed data" : "file";

  // Magic: 00 00 type rank.
  unsigned char magic[4];
  std::size_t got = src->read(magic, 4);
  if (got < 4)
    idx_fail(path, "truncated header: the " + what + " has " + std::to_string(got) +
                   " bytes, the 4-byte magic number needs 4" + src->short_reason());
  if (magic[0] != 0 || magic[1] != 0)
    idx_fail(path, "bad magic " + hex_magic(magic) + ": not an IDX file (the first two bytes must be zero)");
  const unsigned type = magic[2];
  const unsigned rank = magic[3];
  if (!type_name(type)) idx_fail(path, "bad magic: unknown IDX element type " + hex2(type));
  if (type != 0x08)
    idx_fail(path, std::string("unsupported IDX element type ") + hex2(type) + " (" + type_name(type) +
                   "); only unsigned byte (0x08) is supported");
  if (rank == 0) idx_fail(path, "bad magic: rank 0 (an IDX array needs at least one dimension)");

  // Dimensions, big-endian uint32 each.
  std::vector<unsigned char> raw(4 * std::size_t{rank});
  got = src->read(raw.data(), raw.size());
  if (got < raw.size())
    idx_fail(path, "truncated header: rank " + std::to_string(rank) + " needs " + std::to_string(raw.size()) +
                   " bytes of dimensions after the magic, the " + what + " has " + std::to_string(got) +
                   src->short_reason());
  IdxArray out;
  out.dims.resize(rank);
  bool any_zero = false;
  for (unsigned i = 0; i < rank; ++i) {
    out.dims[i] = be32(&raw[4 * i]);
    any_zero |= out.dims[i] == 0;
  }
  std::uint64_t total = any_zero ? 0 : 1;
  if (!any_zero) {
    for (std::int64_t d : out.dims) {
      auto ud = static_cast<std::uint64_t>(d);
      if (total > (kMaxBytes - 1) / ud)
        idx_fail(path, "absurd dimensions " + dims_text(out.dims) +
                       ": they describe 2^34 bytes (16 GiB) or more, the limit");
      total *= ud;
    }
  }
  const std::uint64_t header = 4 + raw.size();

  if (!gzip) {
    // The file size tells truncation and trailing data before anything is
    // allocated (a damaged header may claim gigabytes).
    std::error_code ec;
    std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec) {
      std::uint64_t have = size >= header ? size - header : 0;
      if (have < total)
        idx_fail(path, "truncated data: the dimensions " + dims_text(out.dims) + " need " + std::to_string(total) +
                       " bytes after the header, the file has " + std::to_string(have));
      if (have > total)
        idx_fail(path, "trailing data: " + std::to_string(have - total) + " bytes after the " + std::to_string(total) +
                       " data bytes that the dimensions " + dims_text(out.dims) + " describe");
    }
  }

  // Grow the buffer as data arrives (geometrically, from 16 MiB) so that a
  // truncated gzip file claiming huge dimensions fails before a huge allocation.
  std::size_t have = 0;
  const auto want = static_cast<std::size_t>(total);
  while (have < want) {
    std::size_t next = gzip ? std::min(want, std::max(have * 2, std::size_t{1} << 24)) : want;
    out.data.resize(next);
    std::size_t n = src->read(out.data.data() + have, next - have);
    have += n;
    if (have < next)
      idx_fail(path, "truncated data: the dimensions " + dims_text(out.dims) + " need " + std::to_string(total) +
                     " bytes after the header, the " + what + " has " + std::to_string(have) + src->short_reason());
  }

  // Nothing may follow the data.
  unsigned char scratch[1 << 16];
  std::uint64_t extra = 0;
  while (std::size_t n = src->read(scratch, sizeof scratch)) {
    extra += n;
    if (extra >= (std::uint64_t{1} << 26)) break;  // enough to report
  }
  if (extra)
    idx_fail(path, "trailing data: " + std::string(extra >= (std::uint64_t{1} << 26) ? "at least " : "") +
                   std::to_string(extra) + " bytes after the " + std::to_string(total) +
                   " data bytes that the dimensions " + dims_text(out.dims) + " describe");
  // All data is there but the gzip stream itself ends early (say, without its
  // CRC trailer): the file is damaged all the same.
  std::string reason = src->short_reason();
  if (!reason.empty()) idx_fail(path, "truncated gzip stream after the data" + reason);
  return out;
}

}  // namespace weft
