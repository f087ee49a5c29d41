// The byte-level corpus (weft/text_corpus.h; docs/design/text-corpus.md).
#include "weft/text_corpus.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <system_error>

#include "bounded_draw.h"
#include "weft/env.h"
#include "weft/error.h"

namespace weft {
namespace {

[[noreturn]] void corpus_fail(const std::string& name, const std::string& what) {
  throw InvalidArgument("weft::TextCorpus: " + name + ": " + what);
}

}  // namespace

TextCorpus TextCorpus::load(const std::string& path, std::int64_t context) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) corpus_fail(path, "no such file");
  if (fs::is_directory(path, ec)) corpus_fail(path, "is a directory, not a text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) corpus_fail(path, std::string("cannot be opened: ") + std::strerror(errno));
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) corpus_fail(path, "read failed");
  return TextCorpus(path, std::move(bytes), context);
}

TextCorpus::TextCorpus(std::string name, std::vector<std::uint8_t> bytes, std::int64_t context)
    : name_(std::move(name)), bytes_(std::move(bytes)), context_(context) {
  if (context <= 0) corpus_fail(name_, "context " + std::to_string(context) + " must be positive");
  if (bytes_.empty()) corpus_fail(name_, "the file is empty (a corpus needs text)");
  const std::int64_t n = size();
  train_size_ = n * 9 / 10;  // nanoGPT: train = data[:int(n * 0.9)], validation the rest
  const std::int64_t need = context + 1;
  if (train_size_ < need || validation_size() < need)
    corpus_fail(name_, std::to_string(n) + " bytes split into " + std::to_string(train_size_) + " training and " +
                           std::to_string(validation_size()) + " validation bytes; each split needs at least one "
                           "sequence of context + 1 = " + std::to_string(need) + " bytes (the file needs at least " +
                           std::to_string(10 * need - 9) + " bytes)");
}

void TextCorpus::fill(const std::vector<std::int64_t>& offsets, std::vector<float>& inputs,
                      std::vector<float>& targets) const {
  const auto t = static_cast<std::size_t>(context_);
  inputs.resize(offsets.size() * t);
  targets.resize(offsets.size() * t);
  for (std::size_t b = 0; b < offsets.size(); ++b) {
    const std::uint8_t* src = bytes_.data() + offsets[b];
    float* x = inputs.data() + b * t;
    float* y = targets.data() + b * t;
    for (std::size_t i = 0; i < t; ++i) {
      x[i] = static_cast<float>(src[i]);
      y[i] = static_cast<float>(src[i + 1]);
    }
  }
}

void TextCorpus::train_batch(std::uint64_t seed, std::int64_t step, std::int64_t batch, std::vector<float>& inputs,
                             std::vector<float>& targets) const {
  if (batch <= 0) corpus_fail(name_, "batch " + std::to_string(batch) + " must be positive");
  if (step < 0) corpus_fail(name_, "step " + std::to_string(step) + " must not be negative");
  // One generator per (run value, step): std::seed_seq's mixing is defined by the
  // standard, so the offsets are the same with every standard library.
  const auto s = static_cast<std::uint64_t>(step);
  std::seed_seq mixed{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                      static_cast<std::uint32_t>(s), static_cast<std::uint32_t>(s >> 32)};
  std::mt19937_64 gen(mixed);
  const auto starts = static_cast<std::uint64_t>(train_size_ - context_);  // offsets 0 .. train_size - T - 1
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(batch));
  for (std::int64_t& o : offsets) o = static_cast<std::int64_t>(detail::bounded_draw(gen, starts));
  fill(offsets, inputs, targets);
}

void TextCorpus::validation_batch(std::int64_t index, std::int64_t count, std::int64_t batch,
                                  std::vector<float>& inputs, std::vector<float>& targets) const {
  if (batch <= 0) corpus_fail(name_, "batch " + std::to_string(batch) + " must be positive");
  if (count <= 0 || index < 0 || index >= count)
    corpus_fail(name_, "validation batch " + std::to_string(index) + " of " + std::to_string(count) +
                           " (want 0 <= index < count)");
  const std::int64_t sequences = count * batch;
  const std::int64_t span = validation_size() - context_ - 1;  // the last start, relative to the split
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t k = index * batch + b;
    offsets[static_cast<std::size_t>(b)] = train_size_ + (sequences == 1 ? 0 : k * span / (sequences - 1));
  }
  fill(offsets, inputs, targets);
}

std::string default_text_corpus() { return env::text_or("WEFT_TEXT_CORPUS", "/usr/local/share/weft/kjv.txt"); }

}  // namespace weft
