// weft-pipeline --dist: one pipeline rank per MPI process, optionally
// replicated (pipeline x data parallel): `stages` ranks per pipeline,
// `replicas` pipelines, rank = replica * stages + stage.
#pragma once

#include <cstdint>
#include <string>

#include "weft/device.h"
#include "weft/precision.h"

namespace weft::examples {

struct DistRun {
  std::string model = "lenet";  // lenet or resnet18
  std::string schedule = "1f1b";  // a schedule name or a schedule file
  int stages = 0;                 // 0: the processes / replicas
  int replicas = 1;
  int virtual_stages = 2;  // interleaved-1f1b only
  int chunks = 0;          // 0: 2 x stages
  std::int64_t batch = 64;  // per replica
  int steps = 3;
  bool check = false;  // compare with the unpipelined model on one device (max_diff)
  bool json = false;
  Device device = Device::cpu(0);
  std::string optimizer = "sgd";  // sgd, momentum, adam or adamw (optim::OptimizerOptions::parse)
  // --checkpoint DIR: each stage's process saves its stage's parameters,
  // buffers and optimizer state as its shard of DIR/step-<steps> (replica 0
  // of each stage writes) every checkpoint_every steps (0: at the end only)
  // and at the end; DIR/latest names the newest. --resume DIR (a run
  // directory or one checkpoint) continues from it on the same grid.
  std::string checkpoint;
  int checkpoint_every = 0;
  std::string resume;
  // How the pipeline computes (PipelineOptions::precision; fp16 with
  // dynamic loss scaling); --check trains the one-device model alike.
  Precision precision = Precision::fp32;
};

// Runs the job on this process's rank; prints on rank 0. Returns the exit
// status (2 for a process grid that does not fit the job, or a checkpoint to
// resume that is missing, damaged or of another model, grid or plan).
int run_distributed(const DistRun& run);

}  // namespace weft::examples
