// weft-train-lenet: LeNet (weft::nn::lenet) on Fashion-MNIST with plain SGD,
// on one device or data-parallel on several (trainer.h has the flags).
#include "trainer.h"

int main(int argc, char** argv) {
  // Default learning rate. Plain SGD (no momentum, no weight decay), batch
  // 256, the Kaiming-initialized ReLU LeNet with average pooling, 10 epochs,
  // seed 0 (test accuracy after epoch 10): lr 0.1 -> 0.858, 0.2 -> 0.880,
  // 0.3 -> 0.891. 0.5 still trains (0.838 after 3 epochs) but 0.9 (D2L's
  // value for its sigmoid LeNet, whose gradients are much smaller) kills the
  // ReLUs in the first epoch (stuck at loss 2.30, accuracy 0.10). 0.3 is the
  // fastest of these with a margin below that cliff.
  const weft::examples::ModelSpec lenet{
      .program = "weft-train-lenet",
      .model = "LeNet",
      .json_name = "lenet",
      .default_lr = 0.3f,
      .default_batch_size = 256,
      .lr_note = ": with batch 256 it reaches\n"
                 "                   ~0.89 test accuracy in 10 epochs; 0.1 reaches ~0.86; D2L's\n"
                 "                   0.9 is for its sigmoid LeNet and kills this ReLU one's units",
      .bucket_note = "; LeNet's\n"
                     "                   500 KiB of gradients are then one bucket, reduced after the whole backward",
      .usage_note = "",
      .make = [](weft::Engine& engine, weft::Device device, std::uint64_t seed) {
        return weft::nn::lenet(engine, device, seed);
      }};
  return weft::examples::run_trainer(argc, argv, lenet);
}
