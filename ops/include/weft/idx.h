// IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.
//
// Layout (big-endian): a 4-byte magic 00 00 TT RR (TT the element type, RR the
// rank), then RR 32-bit dimensions, then the elements in row-major order.
// Only unsigned bytes (TT = 0x08) are read; the other IDX types (0x09 int8,
// 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64) are rejected by name.
//
// Rules, each violation a weft::Error whose message starts with
// "weft::read_idx: <path>: ":
//   - the file must exist and open;
//   - plain or gzip is decided by the first two bytes (1f 8b = gzip);
//   - magic bytes 0 and 1 must be zero, the rank at least 1;
//   - the product of the dimensions must be below 2^34 (16 GiB);
//   - the data must hold exactly the bytes the dimensions describe: fewer is
//     "truncated", more is "trailing data" (an error, not ignored: a file with
//     more bytes than its header says is most likely a wrong or damaged
//     header). In a gzip file this is about the decompressed stream; a
//     truncated or corrupt gzip stream is reported with zlib's message.
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
