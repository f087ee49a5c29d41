// Helpers shared between the GPU kernel files. Plain C++ (no CUDA syntax) so
// the cuBLAS / cuDNN wrappers compiled by the host compiler can call kernels
// that live in .cu files.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "weft/error.h"
#include "weft/gpu.h"

struct CUstream_st;  // cudaStream_t

namespace weft::kernels::gpu::detail {

using weft::gpu::WorkerHandles;

// The CUDA stream of a worker: on the cuda backend a weft::gpu::Stream* is the
// cudaStream_t itself (devices/src/cuda_backend.cpp). These kernels run only
// there; simulated GPUs run the CPU kernels (ops/src/launch.h).
inline CUstream_st* cuda_stream(const WorkerHandles& h) noexcept { return reinterpret_cast<CUstream_st*>(h.stream); }

// cuDNN takes int dimensions; a silent wrap would compute on the wrong shape.
inline int to_int(std::int64_t v, const char* what, const char* op) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    throw weft::Error(std::string(op) + ": " + what + " = " + std::to_string(v) +
                      " does not fit cuDNN's int dimensions");
  return static_cast<int>(v);
}

// y[n] = 0 (enqueued; n may be 0).
void zero(const WorkerHandles& h, float* y, std::int64_t n);
// y[r * cols + c] += b[c]
void add_row_bias(const WorkerHandles& h, float* y, const float* b, std::int64_t rows, std::int64_t cols);
// y[c] = sum over r of x[r * cols + c]; overwrites y, rows may be 0.
void column_sums(const WorkerHandles& h, float* y, const float* x, std::int64_t rows, std::int64_t cols);
// c[i * ldc + j] = beta * c[...] for an m x n block (beta == 0 writes zeros
// without reading c, as BLAS does): gemm with k == 0.
void scale_matrix(const WorkerHandles& h, float* c, std::int64_t m, std::int64_t n, std::int64_t ldc, float beta);

// Two-pass reductions keep one double partial per block in h.workspace; this
// is how many fit (0 or 1 means: reduce in a single block instead, which is
// slower for big inputs but needs no scratch at all).
std::int64_t partial_slots(const WorkerHandles& h);
// *out = float(sum of partials[0, count) * scale), in one block.
void finish_partials(const WorkerHandles& h, const double* partials, std::int64_t count, double scale, float* out);

}  // namespace weft::kernels::gpu::detail
