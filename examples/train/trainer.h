// The Fashion-MNIST trainer shared by weft-train-lenet and weft-train-resnet:
// one set of flags (--devices, --dist, --batch-size, --lr, --epochs, --limit,
// --precision, --channels-last, --conv-algo, --optimizer, --weight-decay, --lr-schedule,
// --max-grad-norm, --shard, --checkpoint, --checkpoint-every, --resume,
// --bucket-kb, --no-overlap, --hybridize, --gpu-graphs, --bulk, --trace,
// --data, --seed, --json; --sim-model [PROFILE|COST_TABLE],
// --sim-gpus-per-node, --steps), one training loop (data-parallel through
// weft::parallel::DataParallel, on one device or several, across mpirun
// processes with --dist), one report. With --sim-model it trains nothing:
// it times --steps steps on simulated GPUs with modeled kernels and prints
// the prediction (examples/common/sim_mode.h). A program gives its model
// and its defaults.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "weft/device.h"
#include "weft/engine.h"
#include "weft/nn.h"

namespace weft::examples {

struct ModelSpec {
  const char* program;    // "weft-train-lenet": messages and usage
  const char* model;      // "LeNet": usage and messages
  const char* json_name;  // "lenet": the "model" key of --json
  float default_lr;
  std::int64_t default_batch_size;
  const char* lr_note;      // follows the default in --help, e.g. ": with batch 256 it reaches ..."
  const char* bucket_note;  // follows "25 MiB, as PyTorch DDP" in --help
  const char* usage_note;   // a closing paragraph of --help ("" for none)
  // Builds one replica of the model (1x28x28 inputs, 10 classes) on a device.
  std::function<std::unique_ptr<nn::Sequential>(Engine& engine, Device device, std::uint64_t seed)> make;
};

// Parses argv, trains, prints; returns the exit status (0 done, 2 bad
// arguments or data, 1 failure while training).
int run_trainer(int argc, char** argv, const ModelSpec& model);

}  // namespace weft::examples
