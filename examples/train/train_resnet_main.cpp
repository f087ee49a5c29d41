// weft-train-resnet: ResNet-18 (weft::nn::resnet18, the small stem of D2L's
// multi-GPU chapter for 28x28 inputs) on Fashion-MNIST with plain SGD, on one
// device or data-parallel on several (trainer.h has the flags). Batch
// normalization runs per replica, as in Dive into Deep Learning's multi-GPU
// training: each replica normalizes by its own part of the batch and keeps
// its own running statistics; the test pass uses replica 0's.
#include "trainer.h"

int main(int argc, char** argv) {
  const weft::examples::ModelSpec resnet{
      .program = "weft-train-resnet",
      .model = "ResNet-18",
      .json_name = "resnet18",
      .default_lr = 0.1f,  // D2L's for batch 256 (0.2 for its two-GPU batch 512)
      .default_batch_size = 256,
      .lr_note = ", D2L's for batch 256; it uses 0.2 for batch 512 on two GPUs",
      .bucket_note = "; ResNet-18's\n"
                     "                   43 MiB of gradients are then two buckets",
      .usage_note = "\n\nCost: about 0.9 GFLOP per image forward and twice that backward (11.2 M parameters),\n"
                    "so on a 2-core CPU an epoch over all 60,000 examples takes about 25 minutes;\n"
                    "--limit N trains on a part.",
      .make = [](weft::Engine& engine, weft::Device device, std::uint64_t seed) {
        return weft::nn::resnet18(engine, device, seed);
      }};
  return weft::examples::run_trainer(argc, argv, resnet);
}
