// IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed (told
// apart by the first two bytes: 1f 8b is gzip). Layout, big-endian: a 4-byte
// magic 00 00 TT RR (TT the element type, RR the rank), RR 32-bit dimensions,
// then the elements row-major. Only unsigned bytes (TT = 0x08) are read; the
// other IDX types (int8, int16, int32, float32, float64) are rejected by name.
// Each of these is a weft::Error starting "weft::read_idx: <path>: ": a file
// that does not open; magic bytes 0 and 1 not zero, or rank 0; 2^34 elements
// (16 GiB) or more; data shorter ("truncated") or longer ("trailing data") than
// the dimensions say, counted on the decompressed stream; a corrupt gzip
// stream (with zlib's message).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

// An unsigned-byte IDX array: dims outermost first, data row-major.
struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;
};

// Reads a plain or gzip-compressed unsigned-byte IDX file (rules above).
IdxArray read_idx(const std::string& path);

}  // namespace weft
