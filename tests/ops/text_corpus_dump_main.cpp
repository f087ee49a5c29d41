// Prints weft::TextCorpus's batches for tests/scripts/check_torch_peer_batches.py,
// which compares them with the PyTorch peer's (bench/text_batches.py):
//   weft-test-text-corpus-dump FILE CONTEXT RUN FIRST_STEP STEPS BATCH EVAL_BATCHES
// One line per half batch, ids as integers, row after row:
//   train STEP x ID...   train STEP y ID...   (steps FIRST_STEP .. FIRST_STEP + STEPS - 1)
//   val INDEX x ID...    val INDEX y ID...    (validation batches 0 .. EVAL_BATCHES - 1)
// Exit status 2 on bad arguments or a corpus TextCorpus refuses (its message on stderr).
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "weft/error.h"
#include "weft/text_corpus.h"

namespace {

void print(const char* kind, std::int64_t index, const char* half, const std::vector<float>& ids) {
  std::printf("%s %lld %s", kind, static_cast<long long>(index), half);
  for (float id : ids) std::printf(" %d", static_cast<int>(id));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s FILE CONTEXT RUN FIRST_STEP STEPS BATCH EVAL_BATCHES\n", argv[0]);
    return 2;
  }
  try {
    const std::int64_t context = std::stoll(argv[2]);
    const std::uint64_t run = std::stoull(argv[3]);
    const std::int64_t first = std::stoll(argv[4]);
    const std::int64_t steps = std::stoll(argv[5]);
    const std::int64_t batch = std::stoll(argv[6]);
    const std::int64_t eval_batches = std::stoll(argv[7]);
    const weft::TextCorpus corpus = weft::TextCorpus::load(argv[1], context);
    std::vector<float> x, y;
    for (std::int64_t s = first; s < first + steps; ++s) {
      corpus.train_batch(run, s, batch, x, y);
      print("train", s, "x", x);
      print("train", s, "y", y);
    }
    for (std::int64_t i = 0; i < eval_batches; ++i) {
      corpus.validation_batch(i, eval_batches, batch, x, y);
      print("val", i, "x", x);
      print("val", i, "y", y);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 2;
  }
  return 0;
}
