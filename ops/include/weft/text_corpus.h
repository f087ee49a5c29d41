// A byte-level language-model corpus on the host: a file's bytes, split into
// training (the first 90%) and validation (the last 10%, as nanoGPT does),
// drawn as batches of [B, T] input ids and [B, T] targets (each input's next
// byte), ids as float32. Training batch `step` of a run is a pure function of
// the run's random value and the step: its B offsets come from a
// std::mt19937_64 initialized from both and the project's unbiased bounded draw, so a run resumed at a step draws the same
// batches bit for bit. Validation is a fixed set of batches at evenly spaced
// offsets, the same every evaluation. Host only (no engine, no tensors).
// How: docs/design/text-corpus.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

class TextCorpus {
 public:
  // Reads `path` whole. Throws weft::Error naming the file when it is
  // missing, unreadable or empty, or when a split is shorter than one
  // sequence of context + 1 bytes (context > 0).
  static TextCorpus load(const std::string& path, std::int64_t context);
  // The same from bytes in memory; `name` stands for the file in messages.
  TextCorpus(std::string name, std::vector<std::uint8_t> bytes, std::int64_t context);

  const std::string& name() const { return name_; }
  std::int64_t context() const { return context_; }
  std::int64_t size() const { return static_cast<std::int64_t>(bytes_.size()); }
  std::int64_t train_size() const { return train_size_; }                  // bytes [0, train_size)
  std::int64_t validation_size() const { return size() - train_size_; }   // bytes [train_size, size)

  // Training batch `step` of a run with `seed`: `batch` sequences at offsets
  // drawn uniformly from the training split. inputs and targets are resized
  // to batch x context.
  void train_batch(std::uint64_t seed, std::int64_t step, std::int64_t batch, std::vector<float>& inputs,
                   std::vector<float>& targets) const;
  // Validation batch `index` of `count` (0 <= index < count): the count x
  // batch sequences of an evaluation start at evenly spaced offsets of the
  // validation split, first at its start, last at its end.
  void validation_batch(std::int64_t index, std::int64_t count, std::int64_t batch, std::vector<float>& inputs,
                        std::vector<float>& targets) const;
 private:
  void fill(const std::vector<std::int64_t>& offsets, std::vector<float>& inputs, std::vector<float>& targets) const;

  std::string name_;
  std::vector<std::uint8_t> bytes_;
  std::int64_t context_ = 0;
  std::int64_t train_size_ = 0;
};

// $WEFT_TEXT_CORPUS when set and non-empty, else /usr/local/share/weft/kjv.txt
// (scripts/setup-debian.sh writes it from Debian's bible-kjv).
std::string default_text_corpus();

}  // namespace weft
