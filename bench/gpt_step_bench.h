// weft-bench-ops --gpt: one GPT training step (forward, nn::lm_loss,
// backward, AdamW) on Device::cpu(0) of a threaded engine with the trainers'
// worker count, timed per step, and the engine profiler's per-op breakdown of
// the step. bench/README.md describes the JSON lines; bench/gpt_cpu_step.py
// runs it beside the same step in PyTorch.
#pragma once

#include <string>

namespace weft_bench {

struct GptStepOptions {
  std::string model = "all";  // "tiny", "6x384" or "all"
  int reps = 5;               // timed steps per model (after two warm-up steps)
  int batch = 0;              // 0: the model's default (tiny 16, 6x384 8)
  bool json = false;
  bool profile = true;        // the per-op breakdown (a separate, profiled pass)
};

// Runs the cases and prints them; returns 0, or 2 for an unknown model.
int run_gpt_step_bench(const GptStepOptions& options);

}  // namespace weft_bench
