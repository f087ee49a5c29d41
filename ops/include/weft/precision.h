// weft::Precision — how a model computes, the way users meet it in PyTorch's
// autocast and MXNet's AMP (nn::Layer::set_precision applies it to a model):
//   fp32  strict IEEE float32 (GEMMs and convolutions too);
//   tf32  float32 tensors, GEMMs and convolutions on TF32 tensor cores
//         (10-bit mantissa inputs, float32 accumulation);
//   bf16  mixed precision: float32 master weights and optimizer; dense and
//         convolution layers compute on bfloat16 copies (float32
//         accumulation); losses, batch-norm statistics and reductions float32;
//   fp16  as bf16 with float16, whose narrow range needs loss scaling
//         (parallel::DataParallelOptions::loss_scaling).
// Numerics and costs: docs/design/precision.md.
#pragma once

#include <cstdint>
#include <string_view>

#include "weft/dtype.h"

namespace weft {

enum class Precision : std::uint8_t { fp32, tf32, bf16, fp16 };

std::string_view to_string(Precision p) noexcept;
// "fp32" | "tf32" | "bf16" | "fp16"; anything else is a weft::InvalidArgument
// naming `what` (the flag or setting) and the choices.
Precision parse_precision(std::string_view text, std::string_view what = "precision");
// The dtype dense and convolution layers compute in: float32, or the half.
DType compute_dtype(Precision p) noexcept;
// fp16 only: gradients underflow float16 without a loss scale.
constexpr bool needs_loss_scaling(Precision p) noexcept { return p == Precision::fp16; }

}  // namespace weft
