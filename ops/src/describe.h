// How op errors show a tensor: its name when it has one (Tensor::set_name),
// then its shape; dtype and device only where they matter. Every push-time
// check in ops/src uses these, so a named tensor reads the same everywhere:
//   matmul: inner dimensions differ: 'x' [3, 4] x 'w' [5, 6] (4 vs 5)
#pragma once

#include <string>

#include "weft/tensor.h"

namespace weft::detail {

// "'x' [3, 4]", "[3, 4]" when unnamed, "(none)" when undefined.
std::string describe(const Tensor& t);
// "'x' [3, 4] float32 on gpu(0)", or without the name; "(none)" when undefined.
std::string describe_on(const Tensor& t);

}  // namespace weft::detail
