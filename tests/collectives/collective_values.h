// Values and references shared by the in-process collective tests, on CPU
// devices (test_*.cpp) and on GPUs (test_*_gpu.cpp): integers, distinct per member and
// element, small enough that sums of four are exact in float, so that every
// collective is checked bit for bit against a serial reference.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "weft/engine.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

namespace collective_test {

inline std::vector<float> values(int member, std::int64_t count, int salt = 0) {
  std::vector<float> v(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<float>(((member + 1) * 7919 + i * 31 + salt * 13) % 2003 - 1000);
  return v;
}

// Member r's tensor of values(r, ...) on device(r).
inline std::vector<weft::Tensor> member_tensors(weft::Engine& e, int n, std::int64_t count,
                                                const std::function<weft::Device(int)>& device, int salt = 0) {
  std::vector<weft::Tensor> t;
  for (int r = 0; r < n; ++r)
    t.push_back(weft::Tensor::from_host(e, weft::Shape{count}, values(r, count, salt), device(r)));
  return t;
}

// The reduction over members 0 .. n - 1 (average: the sum times 1/n).
inline std::vector<float> reduced(int n, std::int64_t count, weft::parallel::ReduceOp op, int salt = 0) {
  std::vector<float> out = values(0, count, salt);
  for (int r = 1; r < n; ++r) {
    const std::vector<float> v = values(r, count, salt);
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = op == weft::parallel::ReduceOp::max ? std::max(out[i], v[i]) : out[i] + v[i];
  }
  if (op == weft::parallel::ReduceOp::average && n > 1)
    for (float& x : out) x *= 1.0f / static_cast<float>(n);
  return out;
}

}  // namespace collective_test
