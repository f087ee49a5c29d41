// MNIST-style splits from IDX files, and the minibatch iterator.
#include "weft/dataset.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <system_error>

#include "bounded_draw.h"
#include "weft/env.h"
#include "weft/error.h"
#include "weft/idx.h"

namespace weft {
namespace {

// "<dir>/<stem>" or "<dir>/<stem>.gz", whichever exists (plain first).
std::string find_file(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path plain = fs::path(dir) / stem;
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  std::error_code ec;
  if (fs::is_regular_file(plain, ec)) return plain.string();
  if (fs::is_regular_file(gz, ec)) return gz.string();
  std::string hint = fs::is_directory(dir, ec) ? "" : " (the directory " + dir + " does not exist)";
  throw Error("weft::load_mnist_split: missing file: neither " + plain.string() + " nor " + gz.string() +
              " exists" + hint);
}

[[noreturn]] void dataset_fail(const std::string& path, const std::string& what) {
  throw Error("weft::load_mnist_split: " + path + ": " + what);
}

}  // namespace

Dataset load_mnist_split(const std::string& dir, const std::string& split, std::int64_t limit) {
  if (limit < 0) throw Error("weft::load_mnist_split: limit " + std::to_string(limit) + " is negative");
  const std::string images_path = find_file(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, split + "-labels-idx1-ubyte");

  IdxArray images = read_idx(images_path);
  if (images.dims.size() != 3)
    dataset_fail(images_path, "images must be rank 3 (count, rows, cols), this file has rank " +
                          std::to_string(images.dims.size()));
  if (images.dims[1] == 0 || images.dims[2] == 0)
    dataset_fail(images_path, "images of " + std::to_string(images.dims[1]) + "x" + std::to_string(images.dims[2]) +
                          " pixels (rows and cols must be positive)");
  IdxArray labels = read_idx(labels_path);
  if (labels.dims.size() != 1)
    dataset_fail(labels_path, "labels must be rank 1 (count), this file has rank " + std::to_string(labels.dims.size()));
  if (images.dims[0] != labels.dims[0])
    throw Error("weft::load_mnist_split: count mismatch: " + images_path + " holds " +
                std::to_string(images.dims[0]) + " images but " + labels_path + " holds " +
                std::to_string(labels.dims[0]) + " labels");

  Dataset d;
  d.classes = 10;
  for (std::size_t i = 0; i < labels.data.size(); ++i)
    if (labels.data[i] >= d.classes)
      dataset_fail(labels_path, "label " + std::to_string(labels.data[i]) + " at index " + std::to_string(i) +
                            " is not a class in 0..9");

  d.size = limit > 0 ? std::min(limit, images.dims[0]) : images.dims[0];
  d.channels = 1;
  d.height = images.dims[1];
  d.width = images.dims[2];
  const auto pixels = static_cast<std::size_t>(d.size * d.example_size());
  d.images.resize(pixels);
  constexpr float kScale = 1.0f / 255.0f;
  const std::uint8_t* src = images.data.data();
  float* dst = d.images.data();
  for (std::size_t i = 0; i < pixels; ++i) dst[i] = static_cast<float>(src[i]) * kScale;
  d.labels.assign(labels.data.begin(), labels.data.begin() + d.size);
  return d;
}

std::string default_fashion_mnist_dir() {
  return env::text_or("WEFT_FASHION_MNIST", "/usr/share/datasets/fashion-mnist");
}

MinibatchIterator::MinibatchIterator(const Dataset& data, std::int64_t batch_size, bool shuffle,
                                     std::uint64_t seed, bool drop_last)
    : data_(&data), batch_size_(batch_size), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  if (batch_size <= 0)
    throw Error("weft::MinibatchIterator: batch size " + std::to_string(batch_size) + " must be positive");
  if (data.size < 0 || data.channels <= 0 || data.height <= 0 || data.width <= 0)
    throw Error("weft::MinibatchIterator: bad dataset shape " + std::to_string(data.size) + "x" +
                std::to_string(data.channels) + "x" + std::to_string(data.height) + "x" +
                std::to_string(data.width));
  if (data.images.size() != static_cast<std::size_t>(data.size * data.example_size()) ||
      data.labels.size() != static_cast<std::size_t>(data.size))
    throw Error("weft::MinibatchIterator: the dataset says " + std::to_string(data.size) + " examples of " +
                std::to_string(data.example_size()) + " values but holds " + std::to_string(data.images.size()) +
                " image values and " + std::to_string(data.labels.size()) + " labels");
  start_epoch(0);
}

void MinibatchIterator::start_epoch(int epoch) {
  epoch_ = epoch;
  pos_ = 0;
  order_.resize(static_cast<std::size_t>(data_->size));
  std::iota(order_.begin(), order_.end(), std::int64_t{0});
  if (!shuffle_ || order_.size() < 2) return;
  std::mt19937_64 gen(seed_ + static_cast<std::uint64_t>(static_cast<std::int64_t>(epoch)));
  for (std::size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[detail::bounded_draw(gen, i + 1)]);
}

bool MinibatchIterator::next(std::vector<float>& images, std::vector<float>& labels, std::int64_t& batch) {
  const std::int64_t remaining = data_->size - pos_;
  if (remaining <= 0 || (drop_last_ && remaining < batch_size_)) {
    batch = 0;
    return false;
  }
  batch = std::min(batch_size_, remaining);
  const auto ex = static_cast<std::size_t>(data_->example_size());
  images.resize(static_cast<std::size_t>(batch) * ex);
  labels.resize(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto i = static_cast<std::size_t>(order_[static_cast<std::size_t>(pos_ + b)]);
    std::memcpy(images.data() + static_cast<std::size_t>(b) * ex, data_->images.data() + i * ex, ex * sizeof(float));
    labels[static_cast<std::size_t>(b)] = data_->labels[i];
  }
  pos_ += batch;
  return true;
}

std::int64_t MinibatchIterator::batches_per_epoch() const {
  return drop_last_ ? data_->size / batch_size_ : (data_->size + batch_size_ - 1) / batch_size_;
}

}  // namespace weft
