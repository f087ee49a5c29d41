// Image classification data on the host: MNIST-style IDX splits and a
// shuffling minibatch iterator. Host only (no engine, no tensors): training
// code turns each batch into tensors itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

// `size` examples; images float32 in [0, 1] (byte / 255), size x channels x
// height x width contiguous (NCHW); labels the class indices 0..classes-1 as
// floats, one per example.
struct Dataset {
  std::int64_t size = 0, channels = 1, height = 0, width = 0, classes = 10;
  std::vector<float> images;
  std::vector<float> labels;

  std::int64_t example_size() const { return channels * height * width; }
};

// Loads "<dir>/<split>-images-idx3-ubyte" and "<dir>/<split>-labels-idx1-ubyte",
// each uncompressed or with ".gz" (the uncompressed file wins when both
// exist); split is "train" or "t10k" for (Fashion-)MNIST. limit > 0 keeps the
// first `limit` examples (the whole files are still read and checked);
// limit == 0 keeps all; limit < 0 is an error. Throws weft::Error naming the
// file: a missing file, anything read_idx rejects (see weft/idx.h), images
// not rank 3 or with zero rows/cols, labels not rank 1, image count != label
// count, a label >= 10 (with its index).
Dataset load_mnist_split(const std::string& dir, const std::string& split, std::int64_t limit = 0);

// $WEFT_FASHION_MNIST when set and non-empty, else
// /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist).
std::string default_fashion_mnist_dir();

// Minibatches of a Dataset, copied to host vectors. Each epoch visits every
// example once; with shuffle the order is a Fisher-Yates permutation driven by
// std::mt19937_64 seeded with seed + epoch (and our own unbiased bounded draw,
// not std::shuffle / std::uniform_int_distribution, so the order is the same
// with every standard library). Without shuffle the order is 0..size-1.
// The dataset must outlive the iterator (it is not copied).
class MinibatchIterator {
 public:
  // batch_size > 0. drop_last: skip the last batch when it would be smaller
  // than batch_size. Starts epoch 0.
  MinibatchIterator(const Dataset& data, std::int64_t batch_size, bool shuffle, std::uint64_t seed,
                    bool drop_last = false);
  MinibatchIterator(const Dataset&& data, std::int64_t batch_size, bool shuffle, std::uint64_t seed,
                    bool drop_last = false) = delete;  // would dangle

  // Rewinds to the start of `epoch` with that epoch's order.
  void start_epoch(int epoch);

  // Fills images (batch x C x H x W) and labels (batch) with the next batch and
  // returns true; returns false (batch = 0, vectors untouched) at the end of
  // the epoch. The last batch may be smaller unless drop_last.
  bool next(std::vector<float>& images, std::vector<float>& labels, std::int64_t& batch);

  std::int64_t batches_per_epoch() const;
  int epoch() const { return epoch_; }
  // This epoch's order of example indices.
  const std::vector<std::int64_t>& order() const { return order_; }

 private:
  const Dataset* data_;
  std::int64_t batch_size_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  int epoch_ = 0;
  std::int64_t pos_ = 0;
  std::vector<std::int64_t> order_;
};

}  // namespace weft
